//! Alert thresholds set by policy: the settings of control's alert rules for one agent, one
//! capability or a whole tenant, in a policy's `spec.alerts`.
//!
//! Every field is optional: an unset field takes the tenant policy's value, and without one
//! the control service's flag (`--alert-min-healthy`, ...). Agent policies may set every
//! field, tenant policies set the tenant's defaults, capability policies only
//! `fallback_calls` (the one rule about a capability: calls served by its fallback).

use serde::{Deserialize, Serialize};

use crate::model::FieldError;

/// The alert rules' thresholds of one policy; `None` inherits (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertThresholds {
    /// "Below minimum healthy" fires under this many healthy instances; 0 disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_healthy: Option<u32>,
    /// "Instances lost together" fires at this many losses within `lost_window_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_count: Option<u32>,
    /// The window of `lost_count`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_window_ms: Option<u32>,
    /// "Served by its fallback" fires at this many fallback-served calls in a minute; 0
    /// disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_calls: Option<u32>,
    /// "Breakers open" fires when more than this percentage of an agent's instances have an
    /// open breaker; 100 disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakers_open_percent: Option<u32>,
}

/// The documented range of each field (inclusive).
pub mod ranges {
    pub const MIN_HEALTHY: (u32, u32) = (0, 10_000);
    pub const LOST_COUNT: (u32, u32) = (1, 10_000);
    /// One second to one hour.
    pub const LOST_WINDOW_MS: (u32, u32) = (1_000, 3_600_000);
    pub const FALLBACK_CALLS: (u32, u32) = (0, 1_000_000);
    pub const BREAKERS_OPEN_PERCENT: (u32, u32) = (0, 100);
}

impl AlertThresholds {
    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == AlertThresholds::default()
    }

    /// Each field with its name, for validation and display.
    fn fields(&self) -> [(&'static str, Option<u32>, (u32, u32)); 5] {
        [
            ("min_healthy", self.min_healthy, ranges::MIN_HEALTHY),
            ("lost_count", self.lost_count, ranges::LOST_COUNT),
            ("lost_window_ms", self.lost_window_ms, ranges::LOST_WINDOW_MS),
            ("fallback_calls", self.fallback_calls, ranges::FALLBACK_CALLS),
            ("breakers_open_percent", self.breakers_open_percent, ranges::BREAKERS_OPEN_PERCENT),
        ]
    }

    /// Checks the ranges, and, for the thresholds of a capability policy (`of_capability`),
    /// that only `fallback_calls` is set.
    pub fn validate(&self, of_capability: bool) -> Result<(), FieldError> {
        for (name, value, (min, max)) in self.fields() {
            let Some(value) = value else { continue };
            if of_capability && name != "fallback_calls" {
                return Err(FieldError::new(
                    format!("spec.alerts.{name}"),
                    "does not apply to capability policies (set it in the agent's policy)",
                ));
            }
            if !(min..=max).contains(&value) {
                return Err(FieldError::new(format!("spec.alerts.{name}"), format!("must be between {min} and {max}")));
            }
        }
        Ok(())
    }

    /// These thresholds, with unset fields taken from `fallback`.
    pub fn or(&self, fallback: &AlertThresholds) -> AlertThresholds {
        AlertThresholds {
            min_healthy: self.min_healthy.or(fallback.min_healthy),
            lost_count: self.lost_count.or(fallback.lost_count),
            lost_window_ms: self.lost_window_ms.or(fallback.lost_window_ms),
            fallback_calls: self.fallback_calls.or(fallback.fallback_calls),
            breakers_open_percent: self.breakers_open_percent.or(fallback.breakers_open_percent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_kinds_are_checked_with_the_fields_path() {
        let ok = AlertThresholds { min_healthy: Some(0), lost_count: Some(3), ..Default::default() };
        assert_eq!(ok.validate(false), Ok(()));
        assert_eq!(ok.validate(false), Ok(()));
        let err = ok.validate(true).unwrap_err();
        assert_eq!(err.field, "spec.alerts.min_healthy");
        let fallback = AlertThresholds { fallback_calls: Some(10), ..Default::default() };
        assert_eq!(fallback.validate(true), Ok(()));
        let short = AlertThresholds { lost_window_ms: Some(999), ..Default::default() };
        assert_eq!(
            short.validate(false).unwrap_err(),
            FieldError::new("spec.alerts.lost_window_ms", "must be between 1000 and 3600000")
        );
        let percent = AlertThresholds { breakers_open_percent: Some(101), ..Default::default() };
        assert_eq!(percent.validate(false).unwrap_err().field, "spec.alerts.breakers_open_percent");
        let none = AlertThresholds { lost_count: Some(0), ..Default::default() };
        assert_eq!(none.validate(false).unwrap_err().field, "spec.alerts.lost_count");
    }

    #[test]
    fn unset_fields_inherit_and_unknown_fields_are_refused() {
        let agent = AlertThresholds { min_healthy: Some(3), ..Default::default() };
        let tenant = AlertThresholds { min_healthy: Some(1), lost_count: Some(4), ..Default::default() };
        let merged = agent.or(&tenant);
        assert_eq!((merged.min_healthy, merged.lost_count, merged.fallback_calls), (Some(3), Some(4), None));
        let parsed: Result<AlertThresholds, _> = serde_json::from_str(r#"{"min_healty": 2}"#);
        assert!(parsed.is_err());
        assert!(AlertThresholds::default().is_empty());
        assert_eq!(serde_json::to_string(&agent).unwrap(), r#"{"min_healthy":3}"#);
    }
}
