//! [`RedisSessions`]: sessions on Redis, for high write rates.
//!
//! Keys (names cannot contain `:`, see [`crate::check_name`], so no two sessions' keys
//! collide):
//! - `agent-reach:v1:session:{tenant}:{session}` → a hash: `_v` (the session's version,
//!   +1 per write), `_size`, `_n` (field count), and per field `m:{name}` (JSON: version,
//!   writer, time, content type, lock, size) and `d:{name}` (the value's bytes);
//! - `…:{session}:log` → a stream of the session's writes with ids `0-{version}` (capped
//!   at [`LOG_LEN`] entries, approximately), which watches read and resume from;
//! - `agent-reach:v1:sessions:{tenant}` → a sorted set of the tenant's sessions scored by
//!   expiry time, for the cap on live sessions (exact: checked inside the script).
//!
//! Each write and delete is one Lua script, so its policy checks, limits and effects are
//! atomic (a write reads the session's counters and the written fields' metadata with one
//! `HMGET` and writes them with one `HSET`: six commands for any number of fields, three
//! more when it creates the session); Redis expires the hash and the log together `ttl`
//! after the last write. A watch uses a connection of its own (its `XREAD BLOCK` would
//! stall shared requests) and, when the session's hash disappears without a delete entry,
//! reports the session ended (expired). Versions of one session are consecutive, so a
//! watch that finds a hole (entries trimmed from the log) fails with `Compacted` instead
//! of skipping changes.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value};

use crate::{
    Change, ChangeStream, Field, FieldWrite, Limits, Result, Session, SessionError, SessionStore, Version, WritePolicy,
    Writer, Written, check_name, check_write, now_ms,
};

/// Approximate number of writes a session's log keeps for watches to resume from.
pub const LOG_LEN: usize = 1000;
/// How long a deleted session's log stays, so that live watches see the delete.
const DELETED_LOG_GRACE_MS: u64 = 60_000;
/// How long one `XREAD` blocks before the watch checks that the session still exists.
const WATCH_POLL: Duration = Duration::from_millis(500);

const PUT: &str = r#"
local h, log, idx = KEYS[1], KEYS[2], KEYS[3]
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_session, max_fields, max_sessions = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local log_len, sid, agent, inst, n = tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9], tonumber(ARGV[10])
local want = {'_v', '_size', '_n'}
for k = 0, n - 1 do want[4 + k] = 'm:' .. ARGV[11 + k * 5] end
local got = redis.call('HMGET', h, unpack(want))
local exists = got[1] ~= false
if not exists then
  redis.call('ZREMRANGEBYSCORE', idx, '-inf', now)
  if redis.call('ZCARD', idx) >= max_sessions then return {'sessions'} end
end
local size = tonumber(got[2] or '0')
local count = tonumber(got[3] or '0')
for k = 0, n - 1 do
  local b = 11 + k * 5
  local name, pol, exp, ct, val = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3], ARGV[b + 4]
  local cur = got[4 + k]
  if cur then
    local m = cjson.decode(cur)
    if m.l or pol == 'f' then return {'locked', name, m.a, m.i, tostring(m.v)} end
    if pol == 'c' and exp ~= m.v then return {'conflict', name, tostring(m.v)} end
    size = size - m.s
  else
    if pol == 'c' and exp ~= 0 then return {'conflict', name, '0'} end
    count = count + 1
  end
  size = size + #name + #ct + #val
end
if count > max_fields then return {'fields', tostring(count)} end
if size > max_session then return {'size', tostring(size)} end
if not exists then redis.call('DEL', log) end
local v = tonumber(got[1] or '0') + 1
local entry = {'a', agent, 'i', inst, 't', tostring(now)}
local sets = {'_v', v, '_size', size, '_n', count}
for k = 0, n - 1 do
  local b = 11 + k * 5
  local name, pol, ct, val = ARGV[b], ARGV[b + 1], ARGV[b + 3], ARGV[b + 4]
  local locked = pol == 'f'
  local meta = {v = v, a = agent, i = inst, t = now, ct = ct, l = locked, s = #name + #ct + #val}
  local at = #sets
  sets[at + 1], sets[at + 2], sets[at + 3], sets[at + 4] = 'm:' .. name, cjson.encode(meta), 'd:' .. name, val
  at = #entry
  entry[at + 1], entry[at + 2], entry[at + 3], entry[at + 4] = 'f', name, 'c', ct
  entry[at + 5], entry[at + 6], entry[at + 7], entry[at + 8] = 'd', val, 'l', locked and '1' or '0'
end
redis.call('HSET', h, unpack(sets))
redis.call('PEXPIRE', h, ttl)
redis.call('XADD', log, 'MAXLEN', '~', log_len, '0-' .. v, unpack(entry))
redis.call('PEXPIRE', log, ttl)
redis.call('ZADD', idx, now + ttl, sid)
return {'ok', tostring(v)}
"#;

const DELETE: &str = r#"
local h, log, idx = KEYS[1], KEYS[2], KEYS[3]
local sid, log_len, grace, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('EXISTS', h) == 0 then return {'none'} end
if n == 0 then
  local v = redis.call('HINCRBY', h, '_v', 1)
  redis.call('XADD', log, 'MAXLEN', '~', log_len, '0-' .. v, 'end', '1')
  redis.call('PEXPIRE', log, grace)
  redis.call('DEL', h)
  redis.call('ZREM', idx, sid)
  return {'ok', tostring(v)}
end
local size = tonumber(redis.call('HGET', h, '_size') or '0')
local count = tonumber(redis.call('HGET', h, '_n') or '0')
local gone = {}
for k = 1, n do
  local name = ARGV[4 + k]
  local cur = redis.call('HGET', h, 'm:' .. name)
  if cur then
    local m = cjson.decode(cur)
    if m.l then return {'locked', name, m.a, m.i, tostring(m.v)} end
    size = size - m.s
    count = count - 1
    table.insert(gone, name)
  end
end
if #gone == 0 then return {'none'} end
local v = redis.call('HINCRBY', h, '_v', 1)
local entry = {}
for _, name in ipairs(gone) do
  redis.call('HDEL', h, 'm:' .. name, 'd:' .. name)
  table.insert(entry, 'r')
  table.insert(entry, name)
end
redis.call('HSET', h, '_size', size, '_n', count)
redis.call('XADD', log, 'MAXLEN', '~', log_len, '0-' .. v, unpack(entry))
return {'ok', tostring(v)}
"#;

fn session_key(tenant: &str, session: &str) -> String {
    format!("agent-reach:v1:session:{tenant}:{session}")
}

fn log_key(tenant: &str, session: &str) -> String {
    format!("agent-reach:v1:session:{tenant}:{session}:log")
}

fn index_key(tenant: &str) -> String {
    format!("agent-reach:v1:sessions:{tenant}")
}

fn redis_error(e: redis::RedisError) -> SessionError {
    SessionError::Unavailable(format!("redis: {e}"))
}

#[derive(serde::Deserialize)]
struct FieldMeta {
    v: Version,
    a: String,
    i: String,
    t: u64,
    #[serde(default)]
    ct: String,
    #[serde(default)]
    l: bool,
}

/// Sessions on Redis; see the module documentation.
#[derive(Clone)]
pub struct RedisSessions {
    client: redis::Client,
    conn: ConnectionManager,
    limits: Limits,
    put: Script,
    delete: Script,
}

impl RedisSessions {
    /// Connects to Redis at `url` (`redis://host:port[/db]`).
    pub async fn connect(url: &str, limits: Limits) -> Result<RedisSessions> {
        let client = redis::Client::open(url)
            .map_err(|e| SessionError::Invalid { field: "redis url".into(), reason: e.to_string() })?;
        let conn = ConnectionManager::new(client.clone()).await.map_err(redis_error)?;
        Ok(RedisSessions { client, conn, limits, put: Script::new(PUT), delete: Script::new(DELETE) })
    }
}

/// Redis replies of a script as strings.
fn strings(value: Value) -> Result<Vec<String>> {
    match value {
        Value::Array(items) => items.into_iter().map(string).collect(),
        other => Err(SessionError::Corrupt(format!("unexpected script reply {other:?}"))),
    }
}

fn string(value: Value) -> Result<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b).map_err(|e| SessionError::Corrupt(e.to_string())),
        Value::SimpleString(s) => Ok(s),
        Value::Int(i) => Ok(i.to_string()),
        other => Err(SessionError::Corrupt(format!("unexpected reply {other:?}"))),
    }
}

fn bytes_of(value: Value) -> Result<Bytes> {
    match value {
        Value::BulkString(b) => Ok(Bytes::from(b)),
        Value::SimpleString(s) => Ok(Bytes::from(s)),
        other => Err(SessionError::Corrupt(format!("unexpected reply {other:?}"))),
    }
}

fn number(s: &str) -> Result<u64> {
    s.parse().map_err(|_| SessionError::Corrupt(format!("not a number: {s:?}")))
}

/// Turns a script's refusal into its error.
fn refusal(reply: &[String], limits: &Limits, writes: &[FieldWrite]) -> Result<Version> {
    let at = |i: usize| reply.get(i).cloned().unwrap_or_default();
    match reply.first().map(String::as_str) {
        Some("ok") => number(&at(1)),
        Some("locked") => Err(SessionError::FieldLocked {
            field: at(1),
            writer: Writer { agent: at(2), instance: at(3) },
            version: number(&at(4))?,
        }),
        Some("conflict") => {
            let field = at(1);
            let expected = writes
                .iter()
                .find(|w| w.name == field)
                .and_then(|w| match w.policy {
                    WritePolicy::CompareAndSet { expected } => Some(expected),
                    _ => None,
                })
                .unwrap_or(0);
            Err(SessionError::Conflict { field, expected, current: number(&at(2))? })
        }
        Some("fields") => {
            Err(SessionError::TooManyFields { count: number(&at(1))? as usize, limit: limits.max_fields })
        }
        Some("size") => {
            Err(SessionError::SessionTooLarge { size: number(&at(1))? as usize, limit: limits.max_session_bytes })
        }
        Some("sessions") => Err(SessionError::TooManySessions { limit: limits.max_sessions_per_tenant }),
        _ => Err(SessionError::Corrupt(format!("unexpected script reply {reply:?}"))),
    }
}

#[async_trait::async_trait]
impl SessionStore for RedisSessions {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn get(&self, tenant: &str, session: &str) -> Result<Option<Session>> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        let mut conn = self.conn.clone();
        let all: Vec<(String, Value)> = conn.hgetall(session_key(tenant, session)).await.map_err(redis_error)?;
        if all.is_empty() {
            return Ok(None);
        }
        let mut version = 0;
        let mut metas = BTreeMap::new();
        let mut values = BTreeMap::new();
        for (key, value) in all {
            if key == "_v" {
                version = number(&string(value)?)?;
            } else if let Some(name) = key.strip_prefix("m:") {
                let meta: FieldMeta = serde_json::from_slice(&bytes_of(value)?)
                    .map_err(|e| SessionError::Corrupt(format!("field {name}: {e}")))?;
                metas.insert(name.to_string(), meta);
            } else if let Some(name) = key.strip_prefix("d:") {
                values.insert(name.to_string(), bytes_of(value)?);
            }
        }
        let fields = metas
            .into_iter()
            .map(|(name, m)| {
                let value = values.remove(&name).unwrap_or_default();
                let field = Field {
                    value,
                    content_type: m.ct,
                    version: m.v,
                    writer: Writer { agent: m.a, instance: m.i },
                    written_at_ms: m.t,
                    locked: m.l,
                };
                (name, field)
            })
            .collect();
        Ok(Some(Session { version, fields }))
    }

    async fn put(&self, tenant: &str, session: &str, writer: &Writer, writes: Vec<FieldWrite>) -> Result<Written> {
        check_write(&self.limits, tenant, session, &writes)?;
        let limits = &self.limits;
        let mut invocation = self.put.prepare_invoke();
        invocation
            .key(session_key(tenant, session))
            .key(log_key(tenant, session))
            .key(index_key(tenant))
            .arg(now_ms())
            .arg(limits.ttl.as_millis() as u64)
            .arg(limits.max_session_bytes)
            .arg(limits.max_fields)
            .arg(limits.max_sessions_per_tenant)
            .arg(LOG_LEN)
            .arg(session)
            .arg(&writer.agent)
            .arg(&writer.instance)
            .arg(writes.len());
        for write in &writes {
            let (policy, expected) = match write.policy {
                WritePolicy::FirstWriter => ("f", 0),
                WritePolicy::LastWriter => ("l", 0),
                WritePolicy::CompareAndSet { expected } => ("c", expected),
            };
            invocation.arg(&write.name).arg(policy).arg(expected).arg(&write.content_type).arg(write.value.as_ref());
        }
        let mut conn = self.conn.clone();
        let reply: Value = invocation.invoke_async(&mut conn).await.map_err(redis_error)?;
        let version = refusal(&strings(reply)?, limits, &writes)?;
        Ok(Written { version })
    }

    async fn delete(&self, tenant: &str, session: &str, fields: &[String]) -> Result<Option<Version>> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        for field in fields {
            check_name("field", field)?;
        }
        let mut invocation = self.delete.prepare_invoke();
        invocation
            .key(session_key(tenant, session))
            .key(log_key(tenant, session))
            .key(index_key(tenant))
            .arg(session)
            .arg(LOG_LEN)
            .arg(DELETED_LOG_GRACE_MS)
            .arg(fields.len());
        for field in fields {
            invocation.arg(field);
        }
        let mut conn = self.conn.clone();
        let reply = strings(invocation.invoke_async(&mut conn).await.map_err(redis_error)?)?;
        if reply.first().map(String::as_str) == Some("none") {
            return Ok(None);
        }
        refusal(&reply, &self.limits, &[]).map(Some)
    }

    async fn watch(&self, tenant: &str, session: &str, after: Version) -> Result<ChangeStream> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        // A connection of its own: XREAD BLOCK holds it.
        let conn = self.client.get_multiplexed_async_connection().await.map_err(redis_error)?;
        let state = WatchState {
            conn,
            hash: session_key(tenant, session),
            log: log_key(tenant, session),
            last: after,
            seen: after > 0,
            pending: std::collections::VecDeque::new(),
            done: false,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        });
        Ok(Box::pin(stream))
    }

    async fn live_sessions(&self, tenant: &str) -> Result<u64> {
        check_name("tenant", tenant)?;
        let mut conn = self.conn.clone();
        // Scores are expiry times: live sessions expire after now.
        let live: u64 = conn.zcount(index_key(tenant), now_ms() + 1, "+inf").await.map_err(redis_error)?;
        Ok(live)
    }
}

struct WatchState {
    conn: redis::aio::MultiplexedConnection,
    hash: String,
    log: String,
    last: Version,
    /// Whether the session existed during the watch (so its disappearance is an expiry).
    seen: bool,
    pending: std::collections::VecDeque<Change>,
    done: bool,
}

impl WatchState {
    async fn next(&mut self) -> Option<Result<Change>> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                if matches!(change, Change::Ended { .. }) {
                    self.done = true;
                    self.pending.clear();
                }
                return Some(Ok(change));
            }
            if self.done {
                return None;
            }
            match self.read().await {
                Ok(()) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// Reads the next entries of the log (or notices the session's expiry) into `pending`.
    async fn read(&mut self) -> Result<()> {
        let reply: Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(256)
            .arg("BLOCK")
            .arg(WATCH_POLL.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.log)
            .arg(format!("0-{}", self.last))
            .query_async(&mut self.conn)
            .await
            .map_err(redis_error)?;
        let entries = stream_entries(reply)?;
        if entries.is_empty() {
            let exists: bool =
                redis::cmd("EXISTS").arg(&self.hash).query_async(&mut self.conn).await.map_err(redis_error)?;
            if exists {
                self.seen = true;
            } else if self.seen {
                self.pending.push_back(Change::Ended { version: self.last });
            }
            return Ok(());
        }
        self.seen = true;
        for (version, pairs) in entries {
            if version <= self.last {
                continue;
            }
            if version != self.last + 1 {
                return Err(SessionError::Compacted { after: self.last });
            }
            self.last = version;
            self.pending.push_back(change_of(version, pairs)?);
        }
        Ok(())
    }
}

/// `(version, [field, value, ...])` of every entry of an `XREAD` reply.
fn stream_entries(reply: Value) -> Result<Vec<(Version, Vec<Value>)>> {
    let streams = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => Ok(kv.remove(1)),
                other => Err(SessionError::Corrupt(format!("unexpected XREAD reply {other:?}"))),
            })
            .collect::<Result<Vec<_>>>()?,
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        other => return Err(SessionError::Corrupt(format!("unexpected XREAD reply {other:?}"))),
    };
    let mut out = Vec::new();
    for entries in streams {
        let Value::Array(entries) = entries else { continue };
        for entry in entries {
            let Value::Array(mut parts) = entry else { continue };
            if parts.len() != 2 {
                continue;
            }
            let pairs = match parts.remove(1) {
                Value::Array(pairs) => pairs,
                Value::Map(map) => map.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                _ => Vec::new(),
            };
            let id = string(parts.remove(0))?;
            let version = number(id.split_once('-').map_or(id.as_str(), |(_, seq)| seq))?;
            out.push((version, pairs));
        }
    }
    Ok(out)
}

/// The change one log entry records.
fn change_of(version: Version, pairs: Vec<Value>) -> Result<Change> {
    let mut agent = String::new();
    let mut instance = String::new();
    let mut time = 0;
    let mut fields = BTreeMap::new();
    let mut removed = Vec::new();
    let mut current: Option<(String, String, Bytes)> = None;
    let mut iter = pairs.into_iter();
    while let (Some(k), Some(v)) = (iter.next(), iter.next()) {
        let key = string(k)?;
        match key.as_str() {
            "end" => return Ok(Change::Ended { version }),
            "a" => agent = string(v)?,
            "i" => instance = string(v)?,
            "t" => time = number(&string(v)?)?,
            "f" => current = Some((string(v)?, String::new(), Bytes::new())),
            "c" => {
                if let Some(c) = current.as_mut() {
                    c.1 = string(v)?;
                }
            }
            "d" => {
                if let Some(c) = current.as_mut() {
                    c.2 = bytes_of(v)?;
                }
            }
            "l" => {
                if let Some((name, content_type, value)) = current.take() {
                    let field = Field {
                        value,
                        content_type,
                        version,
                        writer: Writer { agent: agent.clone(), instance: instance.clone() },
                        written_at_ms: time,
                        locked: string(v)? == "1",
                    };
                    fields.insert(name, field);
                }
            }
            "r" => removed.push(string(v)?),
            _ => {}
        }
    }
    if !removed.is_empty() {
        return Ok(Change::Removed { version, fields: removed });
    }
    Ok(Change::Put { version, fields })
}
