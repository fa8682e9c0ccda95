//! End-to-end tests: real control service, sidecars and agents on 127.0.0.1, on a real etcd
//! process and on the embedded store.

mod bad_input;
mod governance;
mod http_agent;
mod lifecycle;
mod observability;
mod policies;
mod resilience;
mod routing;
mod two_sidecars;
