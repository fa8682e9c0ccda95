//! Calls pinned to one instance ([`crate::call::OutboundCall::pin`]): the instance owns
//! what the call names (an A2A task of an agent registered with transport A2A), so no other
//! instance may take it and the router picks that one or none.

use agent_reach::model::Target;
use agent_reach_routing::{GroupState, Member, RouteError, RoutingTable, breaker_settings, resolve};

/// The instance `instance_id` of the target's group. Refused (NO_HEALTHY_INSTANCE, saying
/// why) when it is not in the group, was tried already, or its breaker is open. Its health
/// state is not checked: its sidecar answers why it cannot take the call.
pub(crate) fn pick_instance(
    table: &RoutingTable,
    target: &Target,
    instance_id: &str,
    exclude: &[String],
    now: u64,
) -> Result<(Member, std::sync::Arc<GroupState>), RouteError> {
    let group = resolve(table, target)?;
    let refused =
        |why: String| RouteError::NoHealthyInstance { target: target.to_string(), why, tried: exclude.to_vec() };
    let Some(m) = group.member(instance_id) else {
        return Err(refused(format!("instance {instance_id}, which the call must reach, is not registered")));
    };
    if exclude.iter().any(|e| e == instance_id) {
        return Err(refused(format!("instance {instance_id}, which the call must reach, was tried")));
    }
    if !m.stats.breaker.can_pass(now, &breaker_settings(group)) {
        return Err(refused(format!("instance {instance_id}, which the call must reach, has its circuit open")));
    }
    Ok((m.clone(), group.state.clone()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use agent_reach::model::{HealthState, fixture};

    use super::*;

    fn table() -> RoutingTable {
        let instance = |id: &str, state| fixture::instance(id).agent("sum").capability("x", &[]).state(state).build();
        let list = [instance("a", HealthState::Up), instance("b", HealthState::Down)];
        let map = list.into_iter().map(|i| (i.record.instance_id.clone(), Arc::new(i))).collect();
        RoutingTable::build(7, map, Default::default(), None)
    }

    fn why(r: Result<(Member, Arc<GroupState>), RouteError>) -> String {
        match r {
            Err(RouteError::NoHealthyInstance { why, .. }) => why,
            Err(e) => panic!("{e:?}"),
            Ok((m, _)) => panic!("picked {}", m.id()),
        }
    }

    #[test]
    fn a_pinned_call_reaches_its_instance_or_none() {
        let t = table();
        let target = Target::agent("sum");
        for _ in 0..3 {
            assert_eq!(pick_instance(&t, &target, "a", &[], 1).unwrap().0.id(), "a");
        }
        // DOWN, it is still the one: its sidecar answers why it cannot take the call.
        assert_eq!(pick_instance(&t, &target, "b", &[], 1).unwrap().0.id(), "b");
        assert_eq!(
            why(pick_instance(&t, &target, "gone", &[], 1)),
            "instance gone, which the call must reach, is not registered"
        );
        assert_eq!(
            why(pick_instance(&t, &target, "a", &["a".to_string()], 1)),
            "instance a, which the call must reach, was tried"
        );
        assert!(matches!(pick_instance(&t, &Target::agent("nope"), "a", &[], 1), Err(RouteError::NotFound { .. })));
    }
}
