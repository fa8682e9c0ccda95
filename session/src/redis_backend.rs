//! [`RedisSessions`]: sessions on Redis, for high write rates.
//!
//! Keys (names cannot contain `:`, see [`crate::check_name`], so no two sessions' keys
//! collide):
//! - `agent-reach:v2:session:{tenant}:{session}` → a hash: `_v` (the session's version,
//!   +1 per write), `_size`, `_n` (field count), `_e` (when a write last set the session's
//!   expiry, ms), and per field `m:{name}` (its metadata as one plain string, see
//!   [`Meta`]) and `d:{name}` (the value's bytes);
//! - `…:{session}:log` → a stream of the session's writes with ids `0-{version}` (capped
//!   at [`LOG_LEN`] entries, approximately), which watches read and resume from; an entry
//!   holds the hash fields its write set;
//! - `agent-reach:v2:sessions:{tenant}` → a sorted set of the tenant's sessions scored by
//!   expiry time, for the cap on live sessions (exact: checked inside the script, and a
//!   session's score is set by the same script call that sets its expiry).
//!
//! Each write and delete is one Lua script, so its policy checks, limits and effects are
//! atomic. A write of a live session whose expiry was set less than a tenth of the TTL ago
//! is three commands whatever the number of fields: one `HMGET` (the counters and the
//! written fields' metadata), one `HSET`, one `XADD`; the other writes also set the expiry
//! of the hash and the log (`PEXPIRE`) and the session's score in the tenant index
//! (`ZADD`), and a write creating a session checks the cap first. So, like the etcd
//! backend, a session lives between 0.9 and 1 TTL after its last write (with the clocks of
//! the writing processes agreeing within a tenth of the TTL: the script takes their time).
//! The metadata is parsed in Lua with one `string.match` (no JSON), the limits are
//! constants of the script text (one script per [`Limits`]), and the client sends each
//! field's metadata but the version precomputed.
//!
//! A watch uses a connection of its own (its `XREAD BLOCK` would stall shared requests)
//! and, when the session's hash disappears without a delete entry, reports the session
//! ended (expired). Versions of one session are consecutive, so a watch that finds a hole
//! (entries trimmed from the log) fails with `Compacted` instead of skipping changes.
//!
//! Format: `v2` replaced `v1` (JSON field metadata, expiry and index refreshed on every
//! write). This backend neither reads nor writes `v1` keys: sessions written before an
//! upgrade are not seen after it (a read finds nothing, a write starts the session again)
//! and their keys expire by their own TTL (24 h by default). Upgrade every control replica
//! using one Redis together, or accept that sessions restart once.

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

/// The write script. `@…@` are the limits, replaced by [`put_script`]. KEYS: hash, log,
/// index. ARGV: now (ms), session id, field count n, then per field `m:{name}`,
/// `d:{name}`, policy (`l`, `f`, or the expected version of a compare_and_set), the
/// field's size, its metadata after the version ([`meta_tail`]), its value.
const PUT: &str = r#"
local h, log, idx = KEYS[1], KEYS[2], KEYS[3]
local now, n = tonumber(ARGV[1]), tonumber(ARGV[3])
local want = {'_v', '_size', '_n', '_e'}
for k = 1, n do want[4 + k] = ARGV[k * 6 - 2] end
local got = redis.call('HMGET', h, unpack(want))
local exists = got[1] ~= false
if not exists then
  redis.call('ZREMRANGEBYSCORE', idx, '-inf', now)
  if redis.call('ZCARD', idx) >= @MAX_SESSIONS@ then return {'sessions'} end
end
local size, count = tonumber(got[2] or 0), tonumber(got[3] or 0)
local v = tonumber(got[1] or 0) + 1
local sets = {'_v', v, '_size', 0, '_n', 0}
for k = 1, n do
  local b = k * 6 - 2
  local pol, cur = ARGV[b + 2], got[4 + k]
  if cur then
    local cv, cs, cl = string.match(cur, '^(%d+)|(%d+)|(%d)')
    if cl == '1' or pol == 'f' then return {'locked', k, cur} end
    if pol ~= 'l' and pol ~= cv then return {'conflict', k, cv} end
    size = size - cs
  else
    if pol ~= 'l' and pol ~= 'f' and pol ~= '0' then return {'conflict', k, '0'} end
    count = count + 1
  end
  size = size + ARGV[b + 3]
  local at = #sets
  sets[at + 1], sets[at + 2], sets[at + 3], sets[at + 4] = ARGV[b], v .. ARGV[b + 4], ARGV[b + 1], ARGV[b + 5]
end
if count > @MAX_FIELDS@ then return {'fields', count} end
if size > @MAX_SESSION_BYTES@ then return {'size', size} end
sets[4], sets[6] = size, count
local e = tonumber(got[4] or 0)
local refresh = not exists or now - e >= @REFRESH_MS@ or e - now >= @REFRESH_MS@
if refresh then
  if not exists then redis.call('DEL', log) end
  sets[#sets + 1], sets[#sets + 2] = '_e', now
end
redis.call('HSET', h, unpack(sets))
redis.call('XADD', log, 'MAXLEN', '~', @LOG_LEN@, '0-' .. v, unpack(sets))
if refresh then
  redis.call('PEXPIRE', h, @TTL_MS@)
  redis.call('PEXPIRE', log, @TTL_MS@)
  redis.call('ZADD', idx, now + @TTL_MS@, ARGV[2])
end
return {'ok', v}
"#;

/// The delete script. KEYS: hash, log, index. ARGV: session id, field count n, then the
/// n distinct field names (none: the whole session).
const DELETE: &str = r#"
local h, log, idx = KEYS[1], KEYS[2], KEYS[3]
local sid, n = ARGV[1], tonumber(ARGV[2])
if n == 0 then
  if redis.call('EXISTS', h) == 0 then return {'none'} end
  local v = redis.call('HINCRBY', h, '_v', 1)
  redis.call('XADD', log, 'MAXLEN', '~', @LOG_LEN@, '0-' .. v, 'end', '1')
  redis.call('PEXPIRE', log, @GRACE_MS@)
  redis.call('DEL', h)
  redis.call('ZREM', idx, sid)
  return {'ok', v}
end
local want = {'_v', '_size', '_n'}
for k = 1, n do want[3 + k] = 'm:' .. ARGV[2 + k] end
local got = redis.call('HMGET', h, unpack(want))
if not got[1] then return {'none'} end
local size, count = tonumber(got[2]), tonumber(got[3])
local gone, entry = {}, {}
for k = 1, n do
  local cur = got[3 + k]
  if cur then
    local cv, cs, cl = string.match(cur, '^(%d+)|(%d+)|(%d)')
    if cl == '1' then return {'locked', k, cur} end
    size, count = size - cs, count - 1
    local name = ARGV[2 + k]
    gone[#gone + 1], gone[#gone + 2] = 'm:' .. name, 'd:' .. name
    entry[#entry + 1], entry[#entry + 2] = 'r', name
  end
end
if #gone == 0 then return {'none'} end
local v = tonumber(got[1]) + 1
redis.call('HDEL', h, unpack(gone))
redis.call('HSET', h, '_v', v, '_size', size, '_n', count)
redis.call('XADD', log, 'MAXLEN', '~', @LOG_LEN@, '0-' .. v, unpack(entry))
return {'ok', v}
"#;

/// The write script for `limits`.
fn put_script(limits: &Limits) -> String {
    let ttl = limits.ttl.as_millis() as u64;
    PUT.replace("@MAX_SESSIONS@", &limits.max_sessions_per_tenant.to_string())
        .replace("@MAX_FIELDS@", &limits.max_fields.to_string())
        .replace("@MAX_SESSION_BYTES@", &limits.max_session_bytes.to_string())
        .replace("@REFRESH_MS@", &(ttl / 10).max(1).to_string())
        .replace("@LOG_LEN@", &LOG_LEN.to_string())
        .replace("@TTL_MS@", &ttl.max(1).to_string())
}

fn delete_script() -> String {
    DELETE.replace("@LOG_LEN@", &LOG_LEN.to_string()).replace("@GRACE_MS@", &DELETED_LOG_GRACE_MS.to_string())
}

fn session_key(tenant: &str, session: &str) -> String {
    format!("agent-reach:v2:session:{tenant}:{session}")
}

fn log_key(tenant: &str, session: &str) -> String {
    format!("agent-reach:v2:session:{tenant}:{session}:log")
}

fn index_key(tenant: &str) -> String {
    format!("agent-reach:v2:sessions:{tenant}")
}

/// A field's metadata as stored in `m:{name}`:
/// `{version}|{size}|{locked 0/1}|{time ms}|{agent length}|{instance length}|` then the
/// agent, the instance and the content type, unseparated (lengths in bytes). The script
/// reads only the first three numbers.
#[derive(Debug, PartialEq, Eq)]
struct Meta {
    version: Version,
    size: usize,
    locked: bool,
    written_at_ms: u64,
    writer: Writer,
    content_type: String,
}

/// What follows the version in the metadata of a field `write` writes.
fn meta_tail(writer: &Writer, now: u64, write: &FieldWrite) -> String {
    let size = Field::size(&write.name, &write.value, &write.content_type);
    let locked = u8::from(write.policy == WritePolicy::FirstWriter);
    format!(
        "|{size}|{locked}|{now}|{}|{}|{}{}{}",
        writer.agent.len(),
        writer.instance.len(),
        writer.agent,
        writer.instance,
        write.content_type
    )
}

fn parse_meta(raw: &[u8]) -> Result<Meta> {
    let corrupt = || SessionError::Corrupt(format!("field metadata {:?}", String::from_utf8_lossy(raw)));
    let text = std::str::from_utf8(raw).map_err(|_| corrupt())?;
    let mut parts = text.splitn(7, '|');
    let mut num = || parts.next().and_then(|p| p.parse::<u64>().ok()).ok_or_else(corrupt);
    let (version, size, locked, written_at_ms, agent_len, instance_len) =
        (num()?, num()?, num()?, num()?, num()?, num()?);
    let rest = parts.next().ok_or_else(corrupt)?;
    let (agent_len, instance_len) = (agent_len as usize, instance_len as usize);
    let agent = rest.get(..agent_len).ok_or_else(corrupt)?;
    let instance = rest.get(agent_len..agent_len + instance_len).ok_or_else(corrupt)?;
    let content_type = rest.get(agent_len + instance_len..).ok_or_else(corrupt)?;
    Ok(Meta {
        version,
        size: size as usize,
        locked: locked == 1,
        written_at_ms,
        writer: Writer::new(agent, instance),
        content_type: content_type.to_string(),
    })
}

/// The fields of a hash's (or a log entry's) `m:` and `d:` pairs.
fn fields_of(pairs: impl IntoIterator<Item = (Vec<u8>, Value)>) -> Result<BTreeMap<String, Field>> {
    let mut metas = BTreeMap::new();
    let mut values = BTreeMap::new();
    for (key, value) in pairs {
        if let Some(name) = key.strip_prefix(b"m:") {
            metas.insert(name.to_vec(), parse_meta(&bytes_of(value)?)?);
        } else if let Some(name) = key.strip_prefix(b"d:") {
            values.insert(name.to_vec(), bytes_of(value)?);
        }
    }
    metas
        .into_iter()
        .map(|(name, m)| {
            let value = values.remove(&name).unwrap_or_default();
            let name = String::from_utf8(name).map_err(|e| SessionError::Corrupt(e.to_string()))?;
            let field = Field {
                value,
                content_type: m.content_type,
                version: m.version,
                writer: m.writer,
                written_at_ms: m.written_at_ms,
                locked: m.locked,
            };
            Ok((name, field))
        })
        .collect()
}

fn redis_error(e: redis::RedisError) -> SessionError {
    SessionError::Unavailable(format!("redis: {e}"))
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
        let put = Script::new(&put_script(&limits));
        Ok(RedisSessions { client, conn, limits, put, delete: Script::new(&delete_script()) })
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

/// Turns a script's reply into the write's version or its refusal. `names` are the fields
/// the script was given, in order (the script names a field by its position, from 1).
fn refusal(reply: &[String], limits: &Limits, names: &[&str], writes: &[FieldWrite]) -> Result<Version> {
    let at = |i: usize| reply.get(i).cloned().unwrap_or_default();
    let field = || -> Result<String> {
        let k = number(&at(1))? as usize;
        k.checked_sub(1)
            .and_then(|i| names.get(i))
            .map(|name| name.to_string())
            .ok_or_else(|| SessionError::Corrupt(format!("script reply {reply:?} names no field")))
    };
    match reply.first().map(String::as_str) {
        Some("ok") => number(&at(1)),
        Some("locked") => {
            let meta = parse_meta(at(2).as_bytes())?;
            Err(SessionError::FieldLocked { field: field()?, writer: meta.writer, version: meta.version })
        }
        Some("conflict") => {
            let field = field()?;
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
        let all: Vec<(Vec<u8>, Value)> = conn.hgetall(session_key(tenant, session)).await.map_err(redis_error)?;
        if all.is_empty() {
            return Ok(None);
        }
        let mut version = 0;
        let mut rest = Vec::with_capacity(all.len());
        for (key, value) in all {
            if key == b"_v" {
                version = number(&string(value)?)?;
            } else {
                rest.push((key, value));
            }
        }
        Ok(Some(Session { version, fields: fields_of(rest)? }))
    }

    async fn put(&self, tenant: &str, session: &str, writer: &Writer, writes: Vec<FieldWrite>) -> Result<Written> {
        check_write(&self.limits, tenant, session, &writes)?;
        let now = now_ms();
        let mut invocation = self.put.prepare_invoke();
        invocation
            .key(session_key(tenant, session))
            .key(log_key(tenant, session))
            .key(index_key(tenant))
            .arg(now)
            .arg(session)
            .arg(writes.len());
        for write in &writes {
            let size = Field::size(&write.name, &write.value, &write.content_type);
            invocation.arg(format!("m:{}", write.name)).arg(format!("d:{}", write.name));
            match write.policy {
                WritePolicy::FirstWriter => invocation.arg("f"),
                WritePolicy::LastWriter => invocation.arg("l"),
                WritePolicy::CompareAndSet { expected } => invocation.arg(expected),
            };
            invocation.arg(size).arg(meta_tail(writer, now, write)).arg(write.value.as_ref());
        }
        let mut conn = self.conn.clone();
        let reply: Value = invocation.invoke_async(&mut conn).await.map_err(redis_error)?;
        let names: Vec<&str> = writes.iter().map(|w| w.name.as_str()).collect();
        let version = refusal(&strings(reply)?, &self.limits, &names, &writes)?;
        Ok(Written { version })
    }

    async fn delete(&self, tenant: &str, session: &str, fields: &[String]) -> Result<Option<Version>> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        for field in fields {
            check_name("field", field)?;
        }
        // Each field once, in the order given (a name twice would be counted twice).
        let mut names: Vec<&str> = Vec::with_capacity(fields.len());
        for field in fields {
            if !names.contains(&field.as_str()) {
                names.push(field);
            }
        }
        let mut invocation = self.delete.prepare_invoke();
        invocation
            .key(session_key(tenant, session))
            .key(log_key(tenant, session))
            .key(index_key(tenant))
            .arg(session)
            .arg(names.len());
        for name in &names {
            invocation.arg(*name);
        }
        let mut conn = self.conn.clone();
        let reply = strings(invocation.invoke_async(&mut conn).await.map_err(redis_error)?)?;
        if reply.first().map(String::as_str) == Some("none") {
            return Ok(None);
        }
        refusal(&reply, &self.limits, &names, &[]).map(Some)
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

/// The change one log entry records: the hash fields its write set, `r` pairs naming the
/// fields a field delete removed, or `end`.
fn change_of(version: Version, pairs: Vec<Value>) -> Result<Change> {
    let mut kept = Vec::with_capacity(pairs.len() / 2);
    let mut removed = Vec::new();
    let mut iter = pairs.into_iter();
    while let (Some(k), Some(v)) = (iter.next(), iter.next()) {
        let key = bytes_of(k)?;
        match key.as_ref() {
            b"end" => return Ok(Change::Ended { version }),
            b"r" => removed.push(string(v)?),
            _ => kept.push((key.to_vec(), v)),
        }
    }
    if !removed.is_empty() {
        return Ok(Change::Removed { version, fields: removed });
    }
    Ok(Change::Put { version, fields: fields_of(kept)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_metadata_reads_back_as_written() {
        let writer = Writer::new("refund|agent", "refund-1");
        let write = FieldWrite::new("order", "12345", WritePolicy::FirstWriter).content_type("text/plain; q=0.5");
        let raw = format!("42{}", meta_tail(&writer, 1_764_000_000_123, &write));
        assert_eq!(raw, "42|27|1|1764000000123|12|8|refund|agentrefund-1text/plain; q=0.5");
        assert_eq!(
            parse_meta(raw.as_bytes()),
            Ok(Meta {
                version: 42,
                size: 27,
                locked: true,
                written_at_ms: 1_764_000_000_123,
                writer,
                content_type: "text/plain; q=0.5".into(),
            })
        );
        let plain =
            format!("7{}", meta_tail(&Writer::new("a", "a-1"), 5, &FieldWrite::new("n", "", WritePolicy::LastWriter)));
        assert_eq!(plain, "7|1|0|5|1|3|aa-1");
        assert!(!parse_meta(plain.as_bytes()).unwrap().locked);
        for bad in ["", "7|1|0|5|1", "7|1|0|5|9|3|aa-1", "x|1|0|5|1|3|aa-1"] {
            assert!(matches!(parse_meta(bad.as_bytes()), Err(SessionError::Corrupt(_))), "{bad:?}");
        }
    }

    #[test]
    fn the_scripts_carry_the_limits() {
        let limits = Limits { ttl: Duration::from_secs(3), ..Limits::default() };
        let script = put_script(&limits);
        assert!(!script.contains('@') && !delete_script().contains('@'));
        assert!(script.contains(">= 300 or e - now >= 300") && script.contains("PEXPIRE', h, 3000)"));
        assert!(script.contains(">= 10000 then return {'sessions'}") && script.contains("> 1048576 then"));
    }
}
