//! The Redis backend's key format (`agent-reach:v3:`) on a real `redis-server`: what a
//! write stores (the binary header and field metadata, the log entry), that a write within
//! a tenth of the TTL of the last expiry refresh leaves the expiry and the tenant index
//! alone and a later one moves them, and that `v2` keys are not read.

use std::time::Duration;

use agent_reach_session::testing::RedisServer;
use agent_reach_session::{FieldWrite, Limits, RedisSessions, SessionStore, WritePolicy, Writer};
use redis::AsyncCommands;

/// A session's `_h` header: version, size, field count, last expiry refresh (ms).
async fn header(raw: &mut redis::aio::MultiplexedConnection, hash: &str) -> [u64; 4] {
    let head: Vec<u8> = raw.hget(hash, "_h").await.unwrap();
    assert_eq!(head.len(), 32, "{head:?}");
    let at = |i: usize| f64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().unwrap()) as u64;
    [at(0), at(1), at(2), at(3)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_refresh_the_expiry_and_the_tenant_index_once_a_tenth_of_the_ttl_has_passed() {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    // TTL 2 s: a write refreshes the expiry when 200 ms have passed since the last refresh.
    let limits = Limits { ttl: Duration::from_secs(2), ..Limits::default() };
    let sessions = RedisSessions::connect(&server.url(), limits).await.unwrap();
    let mut raw = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let (hash, log, index) =
        ("agent-reach:v3:session:t:s", "agent-reach:v3:session:t:s:log", "agent-reach:v3:sessions:t");
    let writer = Writer::new("agent", "agent-1");
    let write = |v: &str| vec![FieldWrite::new("a", v.to_string(), WritePolicy::LastWriter).content_type("text/plain")];

    assert_eq!(sessions.put("t", "s", &writer, write("1")).await.unwrap().version, 1);
    let [version, size, count, refreshed] = header(&mut raw, hash).await;
    assert_eq!((version, size, count), (1, 12, 1), "a+1+text/plain is 12 bytes");
    let score: f64 = raw.zscore(index, "s").await.unwrap();
    assert_eq!(score as u64, refreshed + 2000, "the index scores a session by its expiry");
    let meta: Vec<u8> = raw.hget(hash, "m:a").await.unwrap();
    let mut expected = 1f64.to_le_bytes().to_vec();
    expected.extend_from_slice(&12f64.to_le_bytes());
    expected.push(0);
    expected.extend_from_slice(format!("{refreshed}|5|7|agentagent-1text/plain").as_bytes());
    assert_eq!(meta, expected);
    let hash_fields: Vec<String> = raw.hkeys(hash).await.unwrap();
    assert_eq!(hash_fields.len(), 3, "{hash_fields:?}");
    // The log entry of version 1 holds what the write set: its metadata and value.
    let entries: Vec<(String, Vec<Vec<u8>>)> =
        redis::cmd("XRANGE").arg(log).arg("-").arg("+").query_async(&mut raw).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].0, "0-1");
    assert_eq!(entries[0].1, vec![b"m:a".to_vec(), expected, b"d:a".to_vec(), b"1".to_vec()]);
    for key in [hash, log] {
        let ttl: i64 = raw.pttl(key).await.unwrap();
        assert!((1000..=2000).contains(&ttl), "{key} expires in {ttl} ms");
    }

    // At once (well within 200 ms): the expiry and the index are not touched.
    let _: () = raw.pexpire(hash, 60_000).await.unwrap();
    assert_eq!(sessions.put("t", "s", &writer, write("2")).await.unwrap().version, 2);
    let [_, _, _, again] = header(&mut raw, hash).await;
    let ttl: i64 = raw.pttl(hash).await.unwrap();
    assert_eq!(again, refreshed);
    assert!(ttl > 50_000, "a write within a tenth of the TTL set the expiry again ({ttl} ms)");
    assert_eq!(raw.zscore::<_, _, f64>(index, "s").await.unwrap(), score);

    // Past a tenth of the TTL (Redis's clock cannot be paused: a real 300 ms wait).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sessions.put("t", "s", &writer, write("3")).await.unwrap().version, 3);
    let [_, _, _, later] = header(&mut raw, hash).await;
    let ttl: i64 = raw.pttl(hash).await.unwrap();
    assert!(later >= refreshed + 300, "the expiry was not refreshed: {later} vs {refreshed}");
    assert!((1000..=2000).contains(&ttl), "the hash expires in {ttl} ms");
    assert_eq!(raw.zscore::<_, _, f64>(index, "s").await.unwrap() as u64, later + 2000);
    assert_eq!(sessions.live_sessions("t").await, Ok(1));
    let session = sessions.get("t", "s").await.unwrap().unwrap();
    assert_eq!((session.version, session.fields["a"].value.as_ref()), (3, &b"3"[..]));
    assert_eq!(session.fields["a"].written_at_ms, later);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_the_v2_format_are_not_read() {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let sessions = RedisSessions::connect(&server.url(), Limits::default()).await.unwrap();
    let mut raw = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let old = "1|2|0|1764000000000|5|7|agentagent-1";
    let v2 = "agent-reach:v2:session:t:s";
    let _: () =
        raw.hset_multiple(v2, &[("_v", "1"), ("_size", "2"), ("_n", "1"), ("m:a", old), ("d:a", "1")]).await.unwrap();
    assert_eq!(sessions.get("t", "s").await, Ok(None));
    let writer = Writer::new("agent", "agent-1");
    let written = sessions.put("t", "s", &writer, vec![FieldWrite::new("a", "2", WritePolicy::FirstWriter)]).await;
    assert_eq!(written.unwrap().version, 1, "the session starts again in the v3 format");
    let old_value: String = raw.hget(v2, "d:a").await.unwrap();
    assert_eq!(old_value, "1", "v2 keys are left to expire");
}
