//! Session-context write and read costs on each backend, next to the raw store doing the
//! same operation: starts its own etcd and redis-server (like the tests), then prints
//! put p50/p99 (one writer), puts/s (32 writers, each on its own session) and get p50/p99,
//! for `KvSessions` on etcd vs a raw etcd put of the same bytes, and `RedisSessions` vs
//! three raw Redis baselines. The raw store doing the same operation as a session write: on
//! etcd a raw transaction of the shape a session write commits (a compare on one key, two
//! puts on a lease); on Redis a minimal Lua script of a versioned conditional per-field
//! write ([`RAW_SCRIPT`]: read the field's version or lock, check the policy, `HSET` value +
//! version + the hash's version, `PEXPIRE`) that also appends the write to a stream
//! ([`raw_log_script`]: `XADD … MAXLEN ~ 1000` of the field's name and value with the
//! version as the entry id), as a session write appends its change for watches; without
//! the mesh's extras (no writer or content type, no size limits, no tenant cap). The same
//! script without the stream, and a raw `HSET` + `PEXPIRE` pipeline, are shown too. Redis's
//! own time per command (`INFO commandstats`) over each Redis phase says where the
//! difference goes. Ends with the session/raw ratios of puts/s. Run: `cargo run --release -p
//! agent-reach-session --features test-util --example throughput` (numbers, not a
//! pass/fail test).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_session::testing::RedisServer;
use agent_reach_session::{FieldWrite, KvSessions, Limits, RedisSessions, SessionStore, WritePolicy, Writer};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{Compare, EtcdOptions, EtcdStore, Op, Store, Txn};
use bytes::Bytes;

const VALUE: &[u8] = &[b'x'; 256];
const LATENCY_OPS: usize = 2000;
const WRITERS: usize = 32;
const RUN: Duration = Duration::from_secs(3);

/// The raw Redis baseline of the same operation: a versioned conditional write of one
/// field. KEYS: the hash. ARGV: field, policy (`l`, `f` or `c`), expected version, value,
/// TTL (ms). A `first_writer` field's version is stored as `L{version}` (locked).
const RAW_SCRIPT: &str = r#"
local h, name, pol, val = KEYS[1], ARGV[1], ARGV[2], ARGV[4]
local got = redis.call('HMGET', h, '_v', 'v:' .. name)
local cur = got[2]
if cur then
  if string.byte(cur) == 76 or pol == 'f' then return {'locked', cur} end
  if pol == 'c' and ARGV[3] ~= cur then return {'conflict', cur} end
elseif pol == 'c' and ARGV[3] ~= '0' then
  return {'conflict', '0'}
end
local v = tonumber(got[1] or '0') + 1
redis.call('HSET', h, '_v', v, 'v:' .. name, pol == 'f' and 'L' .. v or v, 'd:' .. name, val)
redis.call('PEXPIRE', h, ARGV[5])
return v
"#;

/// [`RAW_SCRIPT`] that also appends the write to a stream, KEYS[2] (the minimal change
/// feed a watch could resume from: the field's name and value at id `0-{version}`).
fn raw_log_script() -> String {
    let script = RAW_SCRIPT
        .replace("return v\n", "redis.call('XADD', KEYS[2], 'MAXLEN', '~', '1000', '0-' .. v, name, val)\nreturn v\n");
    assert!(script.contains("XADD"), "the raw script's return line moved");
    script
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)].as_secs_f64() * 1e3;
    (at(0.50), at(0.99))
}

async fn latency<F, Fut>(op: F) -> (f64, f64)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut samples = Vec::with_capacity(LATENCY_OPS);
    for i in 0..LATENCY_OPS {
        let started = Instant::now();
        op(i).await;
        samples.push(started.elapsed());
    }
    percentiles(samples)
}

async fn throughput<F, Fut>(op: F) -> f64
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let deadline = Instant::now() + RUN;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < deadline {
                    op(w, n).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / RUN.as_secs_f64()
}

fn put(i: usize) -> Vec<FieldWrite> {
    vec![FieldWrite::new(format!("f{}", i % 8), Bytes::from_static(VALUE), WritePolicy::LastWriter)]
}

async fn sessions(name: &str, store: Arc<dyn SessionStore>) -> f64 {
    let writer = Writer::new("bench", "bench-1");
    let (s, w) = (store.clone(), writer.clone());
    let (p50, p99) = latency(move |i| {
        let (s, w) = (s.clone(), w.clone());
        async move {
            s.put("bench", "lat", &w, put(i)).await.unwrap();
        }
    })
    .await;
    let s = store.clone();
    let rate = throughput(move |wr, i| {
        let (s, w) = (s.clone(), Writer::new("bench", "bench-1"));
        async move {
            s.put("bench", &format!("tp-{wr}"), &w, put(i)).await.unwrap();
        }
    })
    .await;
    let s = store.clone();
    let (g50, g99) = latency(move |_| {
        let s = s.clone();
        async move {
            s.get("bench", "lat").await.unwrap();
        }
    })
    .await;
    println!(
        "{name:<22} put p50 {p50:6.3} ms  p99 {p99:6.3} ms  {rate:8.0} puts/s  get p50 {g50:6.3} ms  p99 {g99:6.3} ms"
    );
    rate
}

#[tokio::main]
async fn main() {
    let etcd = EtcdServer::start().expect("etcd");
    let redis = RedisServer::start().expect("redis-server");
    let raw_etcd: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(EtcdOptions {
            user: None,
            tls: None,
            endpoints: vec![etcd.endpoint()],
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
        })
        .await
        .expect("connect etcd"),
    );
    let limits = Limits { max_sessions_per_tenant: 100_000, ..Limits::default() };
    println!("{} puts of one 256-byte field at 1 writer; {WRITERS} writers for {RUN:?}", LATENCY_OPS);

    let e = raw_etcd.clone();
    let (p50, p99) = latency(move |i| {
        let e = e.clone();
        async move {
            e.put(&format!("/raw/lat/f{}", i % 8), Bytes::from_static(VALUE), None).await.unwrap();
        }
    })
    .await;
    let e = raw_etcd.clone();
    let rate = throughput(move |w, i| {
        let e = e.clone();
        async move {
            e.put(&format!("/raw/tp-{w}/f{}", i % 8), Bytes::from_static(VALUE), None).await.unwrap();
        }
    })
    .await;
    println!("{:<22} put p50 {p50:6.3} ms  p99 {p99:6.3} ms  {rate:8.0} puts/s", "raw etcd put");
    let raw_etcd_put = rate;
    let lease = raw_etcd.grant_lease(Duration::from_secs(86_400)).await.expect("lease").id;
    for session in std::iter::once("lat".to_string()).chain((0..WRITERS).map(|w| format!("tp-{w}"))) {
        raw_etcd.put(&format!("/raw/{session}/meta"), Bytes::from_static(b"{}"), Some(lease)).await.unwrap();
    }
    let e = raw_etcd.clone();
    let (p50, p99) = latency(move |i| {
        let e = e.clone();
        async move { raw_txn(&*e, "lat", i, lease).await }
    })
    .await;
    let e = raw_etcd.clone();
    let rate = throughput(move |w, i| {
        let e = e.clone();
        async move { raw_txn(&*e, &format!("tp-{w}"), i, lease).await }
    })
    .await;
    println!("{:<22} put p50 {p50:6.3} ms  p99 {p99:6.3} ms  {rate:8.0} puts/s", "raw etcd txn 2 puts");
    let raw_etcd_txn = rate;
    let on_etcd = sessions("sessions on etcd", Arc::new(KvSessions::new(raw_etcd.clone(), limits.clone()))).await;

    let client = redis::Client::open(redis.url()).unwrap();
    let conn = redis::aio::ConnectionManager::new(client).await.unwrap();
    reset_stats(&conn).await;
    let c = conn.clone();
    let (p50, p99) = latency(move |i| {
        let mut c = c.clone();
        async move {
            let _: () = redis::pipe()
                .atomic()
                .hset("raw:lat", format!("f{}", i % 8), VALUE)
                .ignore()
                .pexpire("raw:lat", 86_400_000)
                .ignore()
                .query_async(&mut c)
                .await
                .unwrap();
        }
    })
    .await;
    let c = conn.clone();
    let rate = throughput(move |w, i| {
        let mut c = c.clone();
        async move {
            let key = format!("raw:tp-{w}");
            let _: () = redis::pipe()
                .atomic()
                .hset(&key, format!("f{}", i % 8), VALUE)
                .ignore()
                .pexpire(&key, 86_400_000)
                .ignore()
                .query_async(&mut c)
                .await
                .unwrap();
        }
    })
    .await;
    println!("{:<22} put p50 {p50:6.3} ms  p99 {p99:6.3} ms  {rate:8.0} puts/s", "raw redis hset+pexpire");
    println!("{:<22} {}", "  redis server time", server_time(&conn, &["hset", "pexpire"]).await);
    let raw_redis_pipeline = rate;

    reset_stats(&conn).await;
    let script = redis::Script::new(RAW_SCRIPT);
    let (c, s) = (conn.clone(), script.clone());
    let (p50, p99) = latency(move |i| {
        let (c, s) = (c.clone(), s.clone());
        async move { raw_script(&c, &s, "raw:cas:lat", i).await }
    })
    .await;
    let (c, s) = (conn.clone(), script.clone());
    let rate = throughput(move |w, i| {
        let (c, s) = (c.clone(), s.clone());
        async move { raw_script(&c, &s, &format!("raw:cas:tp-{w}"), i).await }
    })
    .await;
    println!("{:<22} put p50 {p50:6.3} ms  p99 {p99:6.3} ms  {rate:8.0} puts/s", "raw redis cas script");
    println!("{:<22} {}", "  redis server time", server_time(&conn, &["evalsha"]).await);
    let raw_redis_script = rate;

    reset_stats(&conn).await;
    let script = redis::Script::new(&raw_log_script());
    let (c, s) = (conn.clone(), script.clone());
    let (p50, p99) = latency(move |i| {
        let (c, s) = (c.clone(), s.clone());
        async move { raw_script(&c, &s, "raw:log:lat", i).await }
    })
    .await;
    let (c, s) = (conn.clone(), script.clone());
    let rate = throughput(move |w, i| {
        let (c, s) = (c.clone(), s.clone());
        async move { raw_script(&c, &s, &format!("raw:log:tp-{w}"), i).await }
    })
    .await;
    println!("{:<22} put p50 {p50:6.3} ms  p99 {p99:6.3} ms  {rate:8.0} puts/s", "raw redis cas+xadd");
    println!("{:<22} {}", "  redis server time", server_time(&conn, &["evalsha", "xadd"]).await);
    let raw_redis_log = rate;

    reset_stats(&conn).await;
    let sessions_on_redis = RedisSessions::connect(&redis.url(), limits).await.expect("redis sessions");
    let on_redis = sessions("sessions on redis", Arc::new(sessions_on_redis)).await;
    println!("{:<22} {}", "  redis server time", server_time(&conn, &["evalsha", "xadd", "hgetall"]).await);
    println!(
        "ratios of puts/s (target >= 0.7): etcd {:.2} of a raw put, {:.2} of a raw txn; redis {:.2} of the raw pipeline, {:.2} of the raw cas script, {:.2} of the raw cas+xadd script",
        on_etcd / raw_etcd_put,
        on_etcd / raw_etcd_txn,
        on_redis / raw_redis_pipeline,
        on_redis / raw_redis_script,
        on_redis / raw_redis_log
    );
}

/// One write of [`RAW_SCRIPT`] or [`raw_log_script`] (`last_writer`, 8 field names in
/// turn; the stream is `{key}:log`), checked to succeed.
async fn raw_script(conn: &redis::aio::ConnectionManager, script: &redis::Script, key: &str, i: usize) {
    let mut c = conn.clone();
    let version: u64 = script
        .key(key)
        .key(format!("{key}:log"))
        .arg(format!("f{}", i % 8))
        .arg("l")
        .arg(0)
        .arg(VALUE)
        .arg(86_400_000)
        .invoke_async(&mut c)
        .await
        .expect("the raw script");
    assert!(version > 0);
}

/// What a session write on etcd commits, raw, in one round trip: a compare on the session's
/// `meta` key (on its value, so no revision has to be tracked; the key is created first),
/// then `meta` and one field put on a lease.
async fn raw_txn(e: &dyn Store, session: &str, i: usize, lease: agent_reach_store::LeaseId) {
    let meta = format!("/raw/{session}/meta");
    let txn = Txn {
        compares: vec![Compare::Value(meta.clone(), Bytes::from_static(b"{}"))],
        success: vec![
            Op::Put { key: meta, value: Bytes::from_static(b"{}"), lease: Some(lease) },
            Op::Put {
                key: format!("/raw/{session}/f/f{}", i % 8),
                value: Bytes::from_static(VALUE),
                lease: Some(lease),
            },
        ],
        failure: vec![],
    };
    assert!(e.txn(txn).await.unwrap().succeeded, "the raw transaction's compare failed");
}

async fn reset_stats(conn: &redis::aio::ConnectionManager) {
    let mut c = conn.clone();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
}

/// Redis's own microseconds per call of `commands` since the last reset.
async fn server_time(conn: &redis::aio::ConnectionManager, commands: &[&str]) -> String {
    let mut c = conn.clone();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    let mut out = Vec::new();
    for command in commands {
        let prefix = format!("cmdstat_{command}:");
        if let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) {
            let field = |name: &str| {
                line.split(',').find_map(|kv| kv.strip_prefix(name)).unwrap_or("?").trim_start_matches('=').to_string()
            };
            let calls = field(&format!("{prefix}calls"));
            out.push(format!("{command} {} µs/call ({calls} calls)", field("usec_per_call")));
        }
    }
    out.join(", ")
}
