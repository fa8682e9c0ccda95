//! Routing, as every sidecar does it: the routing table (all instances of a tenant at one
//! revision, indexed by capability and agent) and the picking of an instance for a call,
//! with the reason every other instance was skipped.
//!
//! Pure domain code: no protobuf, no network, no store. The sidecar routes calls with it;
//! the control service explains routes with the same code.

pub mod route;
pub mod table;

pub use route::{Explanation, RouteError, Skip, explain, pick, resolve, suggestions};
pub use table::{Change, Group, RoutingTable, TableHandle};
