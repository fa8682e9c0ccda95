//! The one way the sidecar calls a replicated control service: try each endpoint once,
//! starting with the one that answered last, move to the next one when a replica fails or
//! does not answer in time, and remember the one that answered.
//!
//! [`Failover`] is generic over the client type (the control, identity, sessions and tasks
//! clients all ride the same channels) and over the RPC, given as a closure.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent_reach::reason::{self, Reason};
use tonic::{Code, Status};

/// Which answers move to the next replica, and what a replica that does not answer in
/// time becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rules {
    /// The sidecar's own calls (registration, heartbeats, watch, certificates): a
    /// DEADLINE_EXCEEDED answer also moves on; no answer in time is DEADLINE_EXCEEDED.
    Sidecar,
    /// Calls made for an agent (sessions, tasks): control's DEADLINE_EXCEEDED is passed on
    /// as it came; no answer in time is CONTROL_UNAVAILABLE (with its ErrorInfo).
    Agent,
}

impl Rules {
    /// Whether `status` from one replica means "try the next one".
    fn fails_over(self, status: &Status) -> bool {
        match status.code() {
            Code::Unavailable | Code::Unknown | Code::Cancelled => true,
            Code::DeadlineExceeded => self == Rules::Sidecar,
            _ => false,
        }
    }

    /// The status of a replica at `uri` that gave no answer within `timeout`.
    fn no_answer(self, uri: &str, timeout: Duration) -> Status {
        let message = format!("{uri}: no answer within {timeout:?}");
        match self {
            Rules::Sidecar => Status::deadline_exceeded(message),
            Rules::Agent => reason::status(Reason::ControlUnavailable, message, &[]),
        }
    }
}

/// A client of every control endpoint, in order, and the index of the one that answered
/// last.
pub(crate) struct Failover<C> {
    endpoints: Vec<(String, C)>,
    current: AtomicUsize,
    timeout: Duration,
    rules: Rules,
}

impl<C: Clone> Failover<C> {
    /// Fails when `endpoints` is empty.
    pub(crate) fn new(endpoints: Vec<(String, C)>, timeout: Duration, rules: Rules) -> Result<Failover<C>, String> {
        if endpoints.is_empty() {
            return Err("--control: at least one endpoint is required".into());
        }
        Ok(Failover { endpoints, current: AtomicUsize::new(0), timeout, rules })
    }

    /// Calls `f` with each endpoint's client once, starting with the last one that
    /// answered, while replicas fail as [`Rules`] says; every attempt has the timeout.
    /// The last failure names its endpoint.
    pub(crate) async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = self.current.load(Ordering::Relaxed);
        let n = self.endpoints.len();
        let mut last = Status::unavailable("no control endpoint");
        for i in 0..n {
            let idx = (start + i) % n;
            let (uri, client) = &self.endpoints[idx];
            last = match tokio::time::timeout(self.timeout, f(client.clone())).await {
                Ok(Ok(resp)) => {
                    self.current.store(idx, Ordering::Relaxed);
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) if !self.rules.fails_over(&status) => return Err(status),
                Ok(Err(status)) => Status::new(status.code(), format!("{uri}: {}", status.message())),
                Err(_) => self.rules.no_answer(uri, self.timeout),
            };
            tracing::debug!(control = %uri, "control call failed: {}", last.message());
        }
        Err(last)
    }

    /// The endpoint at `index` (modulo the number of endpoints) and its client.
    pub(crate) fn endpoint(&self, index: usize) -> (&str, C) {
        let (uri, client) = &self.endpoints[index % self.endpoints.len()];
        (uri, client.clone())
    }

    /// Every endpoint's client, in order (for streams that fail over on their own).
    pub(crate) fn clients(&self) -> Vec<C> {
        self.endpoints.iter().map(|(_, c)| c.clone()).collect()
    }

    /// How many endpoints there are (at least one).
    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Endpoints "a", "b", "c" whose clients are their names; `answers` says what each
    /// answers (None: never answers).
    fn three(rules: Rules) -> Failover<&'static str> {
        let endpoints = ["a", "b", "c"].into_iter().map(|n| (n.to_string(), n)).collect();
        Failover::new(endpoints, Duration::from_secs(1), rules).unwrap()
    }

    async fn answer(
        name: &'static str,
        answers: &[(&str, Option<Code>)],
        tried: &Mutex<Vec<&'static str>>,
    ) -> Result<tonic::Response<&'static str>, Status> {
        tried.lock().unwrap().push(name);
        match answers.iter().find(|(n, _)| *n == name).map(|(_, a)| *a) {
            Some(None) => std::future::pending().await,
            Some(Some(code)) => Err(Status::new(code, "refused")),
            None => Ok(tonic::Response::new(name)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn moves_on_while_replicas_fail_and_remembers_the_one_that_answered() {
        let f = three(Rules::Agent);
        let tried = Mutex::new(Vec::new());
        let answers = [("a", Some(Code::Unavailable)), ("b", None)];
        assert_eq!(f.call(|c| answer(c, &answers, &tried)).await.unwrap(), "c");
        assert_eq!(*tried.lock().unwrap(), ["a", "b", "c"]);
        // The next call starts with the endpoint that answered.
        tried.lock().unwrap().clear();
        assert_eq!(f.call(|c| answer(c, &[], &tried)).await.unwrap(), "c");
        assert_eq!(*tried.lock().unwrap(), ["c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_passed_on_without_trying_another_replica() {
        let f = three(Rules::Sidecar);
        let tried = Mutex::new(Vec::new());
        let answers = [("a", Some(Code::InvalidArgument))];
        let err = f.call(|c| answer(c, &answers, &tried)).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "refused"));
        assert_eq!(*tried.lock().unwrap(), ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_and_silence_follow_the_rules() {
        let tried = Mutex::new(Vec::new());
        let answers = [("a", Some(Code::DeadlineExceeded)), ("b", None), ("c", None)];
        // The sidecar's own calls move past DEADLINE_EXCEEDED; silence ends as DEADLINE_EXCEEDED.
        let err = three(Rules::Sidecar).call(|c| answer(c, &answers, &tried)).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::DeadlineExceeded, "c: no answer within 1s"));
        assert_eq!(*tried.lock().unwrap(), ["a", "b", "c"]);
        // An agent's calls get control's DEADLINE_EXCEEDED as it came ...
        tried.lock().unwrap().clear();
        let err = three(Rules::Agent).call(|c| answer(c, &answers, &tried)).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::DeadlineExceeded, "refused"));
        assert_eq!(*tried.lock().unwrap(), ["a"]);
        // ... and silence as CONTROL_UNAVAILABLE.
        let silent = [("a", None), ("b", None), ("c", None)];
        let err = three(Rules::Agent).call(|c| answer(c, &silent, &tried)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(err.message(), "c: no answer within 1s");
        assert_eq!(reason::error_info(&err).unwrap().reason, Reason::ControlUnavailable.as_str());
    }
}
