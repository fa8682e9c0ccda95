//! Routing, as every sidecar does it: the routing table (all instances and policies of a
//! tenant at one revision, indexed by capability and agent) and the picking of an instance
//! for a call, with the reason every other instance was skipped.
//!
//! Pure domain code: no protobuf, no network, no store. The sidecar routes calls with it;
//! the control service explains routes with the same code.

pub mod breaker;
pub mod budget;
#[cfg(test)]
mod memory_tests;
pub mod ring;
pub mod route;
pub mod split;
pub mod stats;
pub mod table;

pub use breaker::{Breaker, BreakerState};
pub use budget::RetryBudget;
pub use route::{
    Candidate, Explanation, PickRequest, RouteError, Skip, Tier, breaker_settings, explain, pick, pick_from, resolve,
    suggestions, tier_of,
};
pub use split::choose_version;
pub use stats::{InFlight, InstanceStats, clock};
pub use table::{CallGuard, Change, Group, GroupState, Member, RoutingTable, TableHandle};
