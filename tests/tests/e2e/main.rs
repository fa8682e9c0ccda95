//! End-to-end tests: real control service, sidecars and agents on 127.0.0.1, on a real etcd
//! process and on the embedded store.

mod a2a;
mod a2a_durable;
mod a2a_transport;
mod abuse;
mod admin;
mod agentless_reports;
mod authz;
mod bad_input;
mod dashboard;
mod dashboard_auth;
mod dashboard_thresholds;
mod faults;
mod floods;
mod governance;
mod health;
mod http_agent;
mod identity;
mod lifecycle;
mod malformed;
mod observability;
mod offline_start;
mod policies;
mod replicas;
mod reply_headers;
mod resilience;
mod routing;
mod session_policies;
mod session_resume;
mod sessions;
mod task_authz;
mod tasks;
mod tenants;
mod topology;
mod two_sidecars;
mod watch_fidelity;
