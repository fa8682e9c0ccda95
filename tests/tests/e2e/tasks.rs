//! Durable tasks end to end: a real etcd, a control replica that is killed and restarted,
//! two sidecars (caller A, target B) and SDK agents. 100 tasks survive a killed instance, a
//! restarted target sidecar and a control restart; cancel reaches the agent; an agent asks
//! for input and the submitter answers; push notifications arrive signed, retried while
//! the receiver is down.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach::proto::{self, TaskState};
use agent_reach::{Agent, Client, HandlerError, Reply, RunningAgent};
use agent_reach_control::{ControlConfig, ControlReplica};
use agent_reach_e2e::{
    Backend, TestStore, init_logging, listener, restart_replica, sidecar_config, start_replica_plaintext,
    wait_for_instances,
};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn state(t: &proto::Task) -> TaskState {
    t.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or_default()
}

fn is_final(s: TaskState) -> bool {
    matches!(s, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn control_config() -> ControlConfig {
    ControlConfig { lease_ttl: Duration::from_secs(5), ..ControlConfig::default() }
}

fn task_sidecar(control: &str, id: &str) -> SidecarConfig {
    let mut c = sidecar_config(control, id);
    c.task_claim_ttl = Duration::from_secs(3);
    c
}

async fn start_on(config: SidecarConfig, local: SocketAddr) -> Sidecar {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(local).await {
            Ok(l) => return Sidecar::start(config, l, listener().await).await.expect("sidecar start"),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("rebinding {local}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot bind {local} again: {e}"),
        }
    }
}

/// What the workers saw: handler starts and finished executions per task.
#[derive(Default)]
struct Work {
    started: Mutex<HashMap<String, u32>>,
    finished: Mutex<HashMap<String, u32>>,
}

async fn worker(sidecar: SocketAddr, work: Arc<Work>, delay: Duration) -> RunningAgent {
    Agent::builder("worker")
        .sidecar(sidecar.to_string())
        .capability("work", Vec::<String>::new())
        .handle("work", move |call| {
            let work = work.clone();
            async move {
                let task = call.task().ok_or_else(|| HandlerError::new(tonic::Code::InvalidArgument, "not a task"))?;
                *work.started.lock().unwrap().entry(task.id().to_string()).or_default() += 1;
                tokio::time::sleep(delay).await;
                *work.finished.lock().unwrap().entry(task.id().to_string()).or_default() += 1;
                Ok(Reply::text(format!("done:{}", call.text()?)))
            }
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("worker start")
}

async fn all_final(client: &Client, ids: &[String], timeout: Duration) -> Vec<proto::Task> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut tasks = Vec::new();
        for id in ids {
            match client.task(id.clone()).get().await {
                Ok(t) => tasks.push(t),
                Err(e) => tracing::debug!("get {id}: {e}"),
            }
        }
        let open = tasks.iter().filter(|t| !is_final(state(t))).count() + (ids.len() - tasks.len());
        if open == 0 {
            return tasks;
        }
        if Instant::now() > deadline {
            let stuck: Vec<_> =
                tasks.iter().filter(|t| !is_final(state(t))).map(|t| (&t.id, state(t), &t.attempts)).take(5).collect();
            panic!("{open} tasks still open after {timeout:?}: {stuck:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// 100 tasks; the instance working on some is killed, the target's sidecar restarted and
/// then control restarted while they run. Every task ends COMPLETED (or FAILED with a
/// reason), no task is lost, none finishes twice, and ListTasks agrees with every GetTask.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_survive_a_killed_instance_a_restarted_sidecar_and_a_control_restart() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let etcd = ts.etcd.as_ref().unwrap().endpoint();
    // Explicit plaintext: these tests restart sidecars while control is down, which a
    // sidecar with identity cannot do yet (it keeps no certificate on disk).
    let replica = start_replica_plaintext(&etcd, control_config());
    let control_addr = replica.addr();
    let mut replica: Option<ControlReplica> = Some(replica);
    let a =
        start_on(task_sidecar(&replica.as_ref().unwrap().endpoint(), "host-a"), "127.0.0.1:0".parse().unwrap()).await;
    let b_config = task_sidecar(&format!("http://{control_addr}"), "host-b");
    let mut b = Some(start_on(b_config.clone(), "127.0.0.1:0".parse().unwrap()).await);
    let b_local = b.as_ref().unwrap().local_addr();
    let work = Arc::new(Work::default());
    let w1 = worker(b_local, work.clone(), Duration::from_millis(1500)).await;
    let w2 = worker(b_local, work.clone(), Duration::from_millis(1500)).await;
    wait_for_instances(&a, &[w1.instance_id(), w2.instance_id()]).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let mut ids = Vec::new();
    let mut w1 = Some(w1);
    for i in 0..100 {
        let submitted = client.submit("work").text(format!("job-{i}")).send().await.expect("submit");
        assert!(submitted.created);
        ids.push(submitted.id().to_string());
        if i == 30 {
            // The instance dies mid-work: its tasks go to the other instance.
            w1.take().unwrap().abort();
        }
        if i == 60 {
            // The target's sidecar restarts on the same address; its agent registers again.
            b.take().unwrap().stop().await;
            b = Some(start_on(b_config.clone(), b_local).await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Control restarts while tasks are still being worked on.
    let killed_at = now_ms();
    replica.take().unwrap().kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _replica = restart_replica(&etcd, control_config(), control_addr).await;

    let tasks = all_final(&client, &ids, Duration::from_secs(120)).await;
    assert_eq!(tasks.len(), 100, "no task is lost");
    let mut completed = 0;
    for t in &tasks {
        match state(t) {
            TaskState::Completed => {
                completed += 1;
                let result = &t.artifacts.iter().find(|a| a.name == "result").expect("result artifact").parts[0].data;
                let input = &t.messages[0].parts[0].data;
                assert_eq!(result.as_ref(), [b"done:".as_ref(), input.as_ref()].concat().as_slice());
            }
            TaskState::Failed => {
                let reason = &t.status.as_ref().unwrap().reason;
                assert!(!reason.is_empty(), "task {} failed without a reason", t.id);
            }
            other => panic!("task {} ended {other:?}", t.id),
        }
        let history: Vec<i32> = t.history.iter().map(|h| h.state).collect();
        assert_eq!(history.first(), Some(&(TaskState::Submitted as i32)));
        assert!(t.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "transition times in order");
        assert!(t.attempts.iter().all(|a| a.ended_at_ms != 0), "every attempt of {} is closed", t.id);
    }
    let finished = work.finished.lock().unwrap().clone();
    let started = work.started.lock().unwrap().clone();
    let mut interrupted = 0;
    for t in &tasks {
        let runs = finished.get(&t.id).copied().unwrap_or(0);
        let want = if state(t) == TaskState::Completed { 1 } else { 0 };
        assert_eq!(runs, want, "task {} ({:?}) finished {runs} times at the agents", t.id, state(t));
        // Runs cut off by the kill or the restart, then run again (by the mesh's own retry
        // within an attempt, or by a new attempt).
        interrupted += started.get(&t.id).copied().unwrap_or(0) - runs;
    }
    assert!(interrupted >= 1, "the kill hit tasks mid-work");
    let across_restart = tasks
        .iter()
        .filter(|t| {
            let at = |s: TaskState| t.history.iter().find(|h| h.state == s as i32).map(|h| h.at_ms).unwrap_or(0);
            at(TaskState::Working) < killed_at && at(TaskState::Completed) > killed_at
        })
        .count();
    assert!(across_restart >= 1, "some tasks were being worked on while control restarted");
    assert!(completed >= 90, "most tasks complete: {completed}");

    // ListTasks agrees with the store.
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .raw()
            .list_tasks(proto::ListTasksRequest { page_size: 30, page_token: token.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        listed.extend(page.tasks);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed.len(), 100);
    let by_id: HashMap<_, _> = tasks.iter().map(|t| (t.id.clone(), t)).collect();
    for t in &listed {
        let stored = by_id.get(&t.id).expect("listed task exists");
        assert_eq!((state(t), t.version), (state(stored), stored.version), "task {}", t.id);
    }
    let moved = a.tasks().stats().taken_over.load(Ordering::Relaxed);
    let attempts: usize = tasks.iter().map(|t| t.attempts.len()).sum();
    tracing::info!(completed, moved, interrupted, attempts, across_restart, "durability run done");
    w2.abort();
    a.stop().await;
    b.take().unwrap().stop().await;
}

/// Starts control (etcd), caller sidecar A and target sidecar B.
async fn small_mesh() -> (TestStore, ControlReplica, Sidecar, Sidecar) {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    // Explicit plaintext, as above.
    let replica = start_replica_plaintext(&ts.etcd.as_ref().unwrap().endpoint(), control_config());
    let a = start_on(task_sidecar(&replica.endpoint(), "host-a"), "127.0.0.1:0".parse().unwrap()).await;
    let b = start_on(task_sidecar(&replica.endpoint(), "host-b"), "127.0.0.1:0".parse().unwrap()).await;
    (ts, replica, a, b)
}

async fn wait_for_state(client: &Client, id: &str, want: TaskState) -> proto::Task {
    let mut updates = client.task(id).updates().await.unwrap();
    while let Some(t) = futures_util::StreamExt::next(&mut updates).await {
        let t = t.unwrap();
        if state(&t) == want {
            return t;
        }
        assert!(!is_final(state(&t)), "task {id} ended {:?} while waiting for {want:?}", state(&t));
    }
    panic!("task {id}: updates ended before {want:?}");
}

struct DropCount(Arc<AtomicU64>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Canceling a running task cancels the agent's call (its handler is dropped) and the SDK
/// context sees the cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_running_agent() {
    let (_ts, _control, a, b) = small_mesh().await;
    let dropped = Arc::new(AtomicU64::new(0));
    let seen_cancel = Arc::new(AtomicU64::new(0));
    let (d, s) = (dropped.clone(), seen_cancel.clone());
    let slow = Agent::builder("slow")
        .sidecar(b.local_addr().to_string())
        .capability("slow", Vec::<String>::new())
        .handle("slow", move |call| {
            let (d, s) = (d.clone(), s.clone());
            async move {
                let _guard = DropCount(d);
                let task = call.task().expect("a task");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(60)) => Ok(Reply::text("too late")),
                    t = task.canceled() => {
                        if t.map(|t| state(&t) == TaskState::Canceled).unwrap_or(false) {
                            s.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(HandlerError::new(tonic::Code::Cancelled, "canceled"))
                    }
                }
            }
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&a, &[slow.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let task = client.submit("slow").text("x").send().await.unwrap();
    wait_for_state(&client, task.id(), TaskState::Working).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "the handler runs");
    let canceled = task.cancel("no longer needed").await.unwrap();
    assert_eq!(state(&canceled), TaskState::Canceled);
    assert_eq!(canceled.status.as_ref().unwrap().detail, "no longer needed");
    let t0 = Instant::now();
    while dropped.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the agent's handler ended after the cancel");
    // The attempt is closed as canceled.
    let t0 = Instant::now();
    loop {
        let t = task.get().await.unwrap();
        if t.attempts.len() == 1 && t.attempts[0].outcome == "canceled" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "attempt not closed: {:?}", t.attempts);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = task.cancel("twice").await.unwrap_err();
    assert_eq!(again.reason(), Some("TASK_FINISHED"));
    slow.abort();
    a.stop().await;
    b.stop().await;
}

/// The agent asks a question (INPUT_REQUIRED), the submitter answers into the same task,
/// and the agent's answer completes it; every state is in the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_round_trip() {
    let (_ts, _control, a, b) = small_mesh().await;
    let greeter = Agent::builder("greeter")
        .sidecar(b.local_addr().to_string())
        .capability("greet", Vec::<String>::new())
        .handle("greet", |call| async move {
            let task = call.task().expect("a task");
            task.progress("looking you up").await.map_err(|e| HandlerError::new(e.code(), e.to_string()))?;
            let name = task.ask("what is your name?").await.map_err(|e| HandlerError::new(e.code(), e.to_string()))?;
            Ok(Reply::text(format!("{} {name}", call.text()?)))
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&a, &[greeter.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let task = client.submit("greet").text("hello").send().await.unwrap();
    let asking = wait_for_state(&client, task.id(), TaskState::InputRequired).await;
    let question = asking.status.as_ref().unwrap().message.as_ref().unwrap();
    assert_eq!(question.parts[0].data.as_ref(), b"what is your name?");
    assert_eq!(question.role, proto::TaskRole::Agent as i32);
    let early = client.submit("greet").id(task.id()).text("other").send().await.unwrap();
    assert!(!early.created, "the same id answers the existing task");
    task.answer("bob").await.unwrap();
    let done = task.wait().await.unwrap();
    assert_eq!(state(&done), TaskState::Completed);
    assert_eq!(done.artifacts[0].parts[0].data.as_ref(), b"hello bob");
    let history: Vec<TaskState> = done.history.iter().map(|h| TaskState::try_from(h.state).unwrap()).collect();
    assert_eq!(
        history,
        vec![
            TaskState::Submitted,
            TaskState::Working,
            TaskState::Working,
            TaskState::InputRequired,
            TaskState::Working,
            TaskState::Completed
        ]
    );
    let roles: Vec<i32> = done.messages.iter().map(|m| m.role).collect();
    let (user, agent) = (proto::TaskRole::User as i32, proto::TaskRole::Agent as i32);
    assert_eq!(roles, vec![user, agent, agent, user]);
    let not_waiting = task.answer("again").await.unwrap_err();
    assert_eq!(not_waiting.reason(), Some("TASK_BAD_TRANSITION"));
    greeter.abort();
    a.stop().await;
    b.stop().await;
}

/// An HTTP/1.1 request: headers (lower-cased names) and body.
type Request = (HashMap<String, String>, Vec<u8>);

/// Reads one HTTP/1.1 request.
async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let headers: HashMap<String, String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = buf[header_end..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((headers, body))
}

/// Push notifications: the receiver is down for the first 5 s, then every change arrives,
/// in order, signed with the task's secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_is_signed_and_retried_while_the_receiver_is_down() {
    let (_ts, _control, a, b) = small_mesh().await;
    let work = Arc::new(Work::default());
    let w = worker(b.local_addr(), work, Duration::from_millis(300)).await;
    wait_for_instances(&a, &[w.instance_id()]).await;
    // A free port, closed for now.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let submitted_at = Instant::now();
    let task = client.submit("work").text("p").push_url(format!("http://127.0.0.1:{port}/hook")).send().await.unwrap();
    assert_eq!(task.push_secret.len(), 32);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let done = task.wait().await.unwrap();
    assert_eq!(state(&done), TaskState::Completed);

    let server = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let received: Arc<Mutex<Vec<Request>>> = Arc::default();
    let got = received.clone();
    let serving = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = server.accept().await else { return };
            let got = got.clone();
            tokio::spawn(async move {
                while let Some(req) = read_request(&mut conn).await {
                    got.lock().unwrap().push(req);
                    if conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let t0 = Instant::now();
    loop {
        let finals = received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, body)| {
                serde_json::from_slice::<serde_json::Value>(body).map(|v| v["final"] == true).unwrap_or(false)
            })
            .count();
        if finals == 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the final push did not arrive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(submitted_at.elapsed() >= Duration::from_secs(5));
    let received = received.lock().unwrap().clone();
    let mut versions = Vec::new();
    for (headers, body) in &received {
        let signature = headers.get("x-agent-reach-signature").expect("signed");
        assert_eq!(signature, &agent_reach_sidecar::sign_task_push(&task.push_secret, body), "signature");
        assert_eq!(headers.get("x-agent-reach-task"), Some(&task.id().to_string()));
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["taskId"], task.id());
        versions.push(v["version"].as_u64().unwrap());
    }
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "in order, each once: {versions:?}");
    let last: serde_json::Value = serde_json::from_slice(&received.last().unwrap().1).unwrap();
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(versions.last().copied(), Some(done.version));
    // A forged body does not verify.
    assert_ne!(
        agent_reach_sidecar::sign_task_push(b"other secret", &received[0].1),
        received[0].0["x-agent-reach-signature"]
    );
    serving.abort();
    w.abort();
    a.stop().await;
    b.stop().await;
}
