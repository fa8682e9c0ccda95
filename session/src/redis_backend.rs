//! [`RedisSessions`]: sessions on Redis, for high write rates.
//!
//! Keys (names cannot contain `:`, see [`crate::check_name`], so no two sessions' keys
//! collide, and a session key's last `:` segment is the session id):
//! - `agent-reach:v3:session:{tenant}:{session}` → a hash: `_h` (the session's header:
//!   version, size, field count and when a write last set the session's expiry in ms, as
//!   four little-endian `f64`s, 32 bytes), and per field `m:{name}` (its metadata, see
//!   [`Meta`]) and `d:{name}` (the value's bytes);
//! - `…:{session}:log` → a stream of the session's writes with ids `0-{version}` (capped
//!   at [`LOG_LEN`] entries, approximately: `XADD … MAXLEN ~`), which watches read and
//!   resume from; an entry holds the `m:`/`d:` pairs its write set (or `r` pairs naming
//!   the fields a delete removed, or `end`);
//! - `agent-reach:v3:sessions:{tenant}` → a sorted set of the tenant's sessions scored by
//!   expiry time, for the cap on live sessions (exact: checked inside the script, and a
//!   session's score is set by the same script call that sets its expiry).
//!
//! Each write and delete is one Lua script (`EVALSHA` of a script whose sha the client
//! keeps), so its policy checks, limits and effects are atomic. A write of a live session
//! whose expiry was set less than a tenth of the TTL ago is three commands whatever the
//! number of fields: one `HMGET` (the header and the written fields' metadata), one `HSET`,
//! one `XADD`; the other writes also set the expiry of the hash and the log (`PEXPIRE`) and
//! the session's score in the tenant index (`ZADD`), and a write creating a session checks
//! the cap first. So, like the etcd backend, a session lives between 0.9 and 1 TTL after
//! its last write (with the clocks of the writing processes agreeing within a tenth of the
//! TTL: the script takes their time).
//!
//! What the script reads and writes is binary (`struct.pack`/`struct.unpack` in Lua): no
//! decimal text is parsed (`string.match`, `tonumber`) or printed (`tostring`) on Redis's
//! thread but the entry id. The client sends per field its name, a control string (the
//! policy, its expected version and the field's metadata but the version, precomputed, see
//! [`control`]) and the value; the limits are constants of the script text (one script
//! per [`Limits`]). Versions are exact as `f64` up to 2^53.
//!
//! A watch uses a connection of its own (its `XREAD BLOCK` would stall shared requests)
//! and, when the session's hash disappears without a delete entry, reports the session
//! ended (expired). Versions of one session are consecutive, so a watch that finds a hole
//! (entries trimmed from the log) fails with `Compacted` instead of skipping changes.
//!
//! Format: `v3` replaced `v2` (decimal header fields `_v`, `_size`, `_n`, `_e` and text
//! field metadata parsed with `string.match`; log entries repeating the header), which
//! replaced `v1` (JSON field metadata). This backend reads and writes neither: sessions
//! written before an upgrade are not seen after it (a read finds nothing, a write starts
//! the session again) and their keys expire by their own TTL (24 h by default). Upgrade
//! every control replica using one Redis together, or accept that sessions restart once.

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
/// index. ARGV: now (ms, an `f64`), then per field its name, its [`control`] string and
/// its value. Replies the new version, or a refusal `{reason, …}` (see [`refusal`]).
const PUT: &str = r#"
local h, log, idx = KEYS[1], KEYS[2], KEYS[3]
local now = struct.unpack('<d', ARGV[1])
local n = (#ARGV - 1) / 3
local got
if n == 1 then
  got = redis.call('HMGET', h, '_h', 'm:' .. ARGV[2])
else
  local want = {'_h'}
  for k = 1, n do want[k + 1] = 'm:' .. ARGV[k * 3 - 1] end
  got = redis.call('HMGET', h, unpack(want))
end
local v, size, count, e
if got[1] then
  v, size, count, e = struct.unpack('<dddd', got[1])
  v = v + 1
else
  redis.call('ZREMRANGEBYSCORE', idx, '-inf', now)
  if redis.call('ZCARD', idx) >= @MAX_SESSIONS@ then return {'sessions'} end
  v, size, count = 1, 0, 0
end
local vb = struct.pack('<d', v)
local sets = {'_h', false}
for k = 1, n do
  local b = k * 3 - 1
  local name, ctl = ARGV[b], ARGV[b + 1]
  local pol, expected, fsize = struct.unpack('<Bdd', ctl)
  local cur = got[k + 1]
  if cur then
    local cv, cs, cl = struct.unpack('<ddB', cur)
    if cl == 1 or pol == 102 then return {'locked', k, cur} end
    if pol == 99 and expected ~= cv then return {'conflict', k, cv} end
    size = size - cs + fsize
  else
    if pol == 99 and expected ~= 0 then return {'conflict', k, 0} end
    count = count + 1
    size = size + fsize
  end
  local at = k * 4 - 1
  sets[at], sets[at + 1], sets[at + 2], sets[at + 3] = 'm:' .. name, vb .. string.sub(ctl, 10), 'd:' .. name, ARGV[b + 2]
end
if count > @MAX_FIELDS@ then return {'fields', count} end
if size > @MAX_SESSION_BYTES@ then return {'size', size} end
local refresh = not e or now - e >= @REFRESH_MS@ or e - now >= @REFRESH_MS@
if refresh then
  if not e then redis.call('DEL', log) end
  e = now
end
sets[2] = struct.pack('<dddd', v, size, count, e)
redis.call('HSET', h, unpack(sets))
redis.call('XADD', log, 'MAXLEN', '~', '@LOG_LEN@', string.format('0-%d', v), unpack(sets, 3))
if refresh then
  redis.call('PEXPIRE', h, '@TTL_MS@')
  redis.call('PEXPIRE', log, '@TTL_MS@')
  redis.call('ZADD', idx, now + @TTL_MS@, string.match(h, '[^:]*$'))
end
return v
"#;

/// The delete script. KEYS: hash, log, index. ARGV: the distinct field names (none: the
/// whole session). Replies the new version, `{'none'}` when nothing was there to delete,
/// or `{'locked', k, metadata}`.
const DELETE: &str = r#"
local h, log, idx = KEYS[1], KEYS[2], KEYS[3]
local n = #ARGV
if n == 0 then
  local head = redis.call('HGET', h, '_h')
  if not head then return {'none'} end
  local v = struct.unpack('<d', head) + 1
  redis.call('XADD', log, 'MAXLEN', '~', '@LOG_LEN@', string.format('0-%d', v), 'end', '1')
  redis.call('PEXPIRE', log, '@GRACE_MS@')
  redis.call('DEL', h)
  redis.call('ZREM', idx, string.match(h, '[^:]*$'))
  return v
end
local want = {'_h'}
for k = 1, n do want[k + 1] = 'm:' .. ARGV[k] end
local got = redis.call('HMGET', h, unpack(want))
if not got[1] then return {'none'} end
local v, size, count, e = struct.unpack('<dddd', got[1])
local gone, entry = {}, {}
for k = 1, n do
  local cur = got[k + 1]
  if cur then
    local cv, cs, cl = struct.unpack('<ddB', cur)
    if cl == 1 then return {'locked', k, cur} end
    size, count = size - cs, count - 1
    gone[#gone + 1], gone[#gone + 2] = want[k + 1], 'd:' .. ARGV[k]
    entry[#entry + 1], entry[#entry + 2] = 'r', ARGV[k]
  end
end
if #gone == 0 then return {'none'} end
v = v + 1
redis.call('HDEL', h, unpack(gone))
redis.call('HSET', h, '_h', struct.pack('<dddd', v, size, count, e))
redis.call('XADD', log, 'MAXLEN', '~', '@LOG_LEN@', string.format('0-%d', v), unpack(entry))
return v
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
    format!("agent-reach:v3:session:{tenant}:{session}")
}

fn log_key(tenant: &str, session: &str) -> String {
    format!("agent-reach:v3:session:{tenant}:{session}:log")
}

fn index_key(tenant: &str) -> String {
    format!("agent-reach:v3:sessions:{tenant}")
}

/// A field's metadata as stored in `m:{name}`: its version and size as little-endian
/// `f64`s, a byte 1 when it is locked (`first_writer`) else 0 (the 17 bytes the scripts
/// read with `struct.unpack('<ddB', …)`), then as text
/// `{time ms}|{agent length}|{instance length}|` followed by the agent, the instance and
/// the content type, unseparated (lengths in bytes), which only this side reads.
#[derive(Debug, PartialEq, Eq)]
struct Meta {
    version: Version,
    size: usize,
    locked: bool,
    written_at_ms: u64,
    writer: Writer,
    content_type: String,
}

/// The byte of a policy in a [`control`] string (`struct.unpack('<B')` in the script).
fn policy_code(policy: WritePolicy) -> (u8, Version) {
    match policy {
        WritePolicy::LastWriter => (b'l', 0),
        WritePolicy::FirstWriter => (b'f', 0),
        WritePolicy::CompareAndSet { expected } => (b'c', expected),
    }
}

/// What the write script gets for one field besides its name and value: the policy's byte
/// and expected version (`f64`), then the field's metadata but its leading version (size,
/// locked, then the text part of [`Meta`]). The script reads the first 17 bytes
/// (`struct.unpack('<Bdd')`) and stores the write's version followed by this from byte 10.
fn control(writer: &Writer, now: u64, write: &FieldWrite) -> Vec<u8> {
    let size = Field::size(&write.name, &write.value, &write.content_type);
    let (code, expected) = policy_code(write.policy);
    let text = format!(
        "{now}|{}|{}|{}{}{}",
        writer.agent.len(),
        writer.instance.len(),
        writer.agent,
        writer.instance,
        write.content_type
    );
    let mut out = Vec::with_capacity(18 + text.len());
    out.push(code);
    out.extend_from_slice(&(expected as f64).to_le_bytes());
    out.extend_from_slice(&(size as f64).to_le_bytes());
    out.push(u8::from(write.policy == WritePolicy::FirstWriter));
    out.extend_from_slice(text.as_bytes());
    out
}

/// An `f64` the scripts wrote that must be a whole number >= 0.
fn whole(raw: &[u8]) -> Option<u64> {
    let x = f64::from_le_bytes(raw.try_into().ok()?);
    (x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(64)).then_some(x as u64)
}

/// The version in a session's `_h` header.
fn header_version(raw: &[u8]) -> Result<Version> {
    raw.get(..8)
        .filter(|_| raw.len() == 32)
        .and_then(whole)
        .ok_or_else(|| SessionError::Corrupt(format!("session header {raw:?}")))
}

fn parse_meta(raw: &[u8]) -> Result<Meta> {
    let corrupt = || SessionError::Corrupt(format!("field metadata {:?}", String::from_utf8_lossy(raw)));
    if raw.len() < 17 || raw[16] > 1 {
        return Err(corrupt());
    }
    let (version, size) = (whole(&raw[..8]).ok_or_else(corrupt)?, whole(&raw[8..16]).ok_or_else(corrupt)?);
    let text = std::str::from_utf8(&raw[17..]).map_err(|_| corrupt())?;
    let mut parts = text.splitn(4, '|');
    let mut num = || parts.next().and_then(|p| p.parse::<u64>().ok()).ok_or_else(corrupt);
    let (written_at_ms, agent_len, instance_len) = (num()?, num()? as usize, num()? as usize);
    let rest = parts.next().ok_or_else(corrupt)?;
    let agent = rest.get(..agent_len).ok_or_else(corrupt)?;
    let instance = rest.get(agent_len..agent_len + instance_len).ok_or_else(corrupt)?;
    let content_type = rest.get(agent_len + instance_len..).ok_or_else(corrupt)?;
    Ok(Meta {
        version,
        size: size as usize,
        locked: raw[16] == 1,
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

/// What a write or delete script replied: the new version, nothing to delete, or a refusal
/// (its reason, then what [`refusal`] reads).
enum Reply {
    Ok(Version),
    None,
    Refused(String, Vec<Value>),
}

fn reply_of(value: Value) -> Result<Reply> {
    match value {
        Value::Int(v) if v > 0 => Ok(Reply::Ok(v as Version)),
        Value::Array(mut items) if !items.is_empty() => {
            let reason = string(items.remove(0))?;
            if reason == "none" { Ok(Reply::None) } else { Ok(Reply::Refused(reason, items)) }
        }
        other => Err(SessionError::Corrupt(format!("unexpected script reply {other:?}"))),
    }
}

/// The error a script's refusal stands for. `names` are the fields the script was given,
/// in order (the script names a field by its position, from 1).
fn refusal(reason: &str, rest: Vec<Value>, limits: &Limits, names: &[&str], writes: &[FieldWrite]) -> SessionError {
    let detail = format!("unexpected script reply {reason:?} {rest:?}");
    let corrupt = || SessionError::Corrupt(detail.clone());
    let mut rest = rest.into_iter();
    let num = |v: Option<Value>| v.and_then(|v| string(v).ok()).and_then(|s| s.parse::<u64>().ok());
    let field = |k: Option<u64>| k.and_then(|k| (k as usize).checked_sub(1)).and_then(|i| names.get(i).copied());
    match reason {
        "locked" => {
            let (Some(field), Some(raw)) = (field(num(rest.next())), rest.next()) else { return corrupt() };
            match bytes_of(raw).and_then(|raw| parse_meta(&raw)) {
                Ok(meta) => {
                    SessionError::FieldLocked { field: field.to_string(), writer: meta.writer, version: meta.version }
                }
                Err(e) => e,
            }
        }
        "conflict" => {
            let (Some(field), Some(current)) = (field(num(rest.next())), num(rest.next())) else { return corrupt() };
            let expected = writes
                .iter()
                .find(|w| w.name == field)
                .and_then(|w| match w.policy {
                    WritePolicy::CompareAndSet { expected } => Some(expected),
                    _ => None,
                })
                .unwrap_or(0);
            SessionError::Conflict { field: field.to_string(), expected, current }
        }
        "fields" => match num(rest.next()) {
            Some(count) => SessionError::TooManyFields { count: count as usize, limit: limits.max_fields },
            None => corrupt(),
        },
        "size" => match num(rest.next()) {
            Some(size) => SessionError::SessionTooLarge { size: size as usize, limit: limits.max_session_bytes },
            None => corrupt(),
        },
        "sessions" => SessionError::TooManySessions { limit: limits.max_sessions_per_tenant },
        _ => corrupt(),
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
        let mut version = None;
        let mut rest = Vec::with_capacity(all.len());
        for (key, value) in all {
            if key == b"_h" {
                version = Some(header_version(&bytes_of(value)?)?);
            } else {
                rest.push((key, value));
            }
        }
        let version = version.ok_or_else(|| SessionError::Corrupt("a session hash without its header".into()))?;
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
            .arg(&(now as f64).to_le_bytes()[..]);
        for write in &writes {
            invocation.arg(&write.name).arg(control(writer, now, write)).arg(write.value.as_ref());
        }
        let mut conn = self.conn.clone();
        let reply = invocation.invoke_async(&mut conn).await.map_err(redis_error)?;
        match reply_of(reply)? {
            Reply::Ok(version) => Ok(Written { version }),
            Reply::Refused(reason, rest) => {
                let names: Vec<&str> = writes.iter().map(|w| w.name.as_str()).collect();
                Err(refusal(&reason, rest, &self.limits, &names, &writes))
            }
            Reply::None => Err(SessionError::Corrupt("the write script replied none".into())),
        }
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
        invocation.key(session_key(tenant, session)).key(log_key(tenant, session)).key(index_key(tenant));
        for name in &names {
            invocation.arg(*name);
        }
        let mut conn = self.conn.clone();
        match reply_of(invocation.invoke_async(&mut conn).await.map_err(redis_error)?)? {
            Reply::Ok(version) => Ok(Some(version)),
            Reply::None => Ok(None),
            Reply::Refused(reason, rest) => Err(refusal(&reason, rest, &self.limits, &names, &[])),
        }
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

    /// The metadata the write script stores for a field written at `version` with `ctl`.
    fn stored(version: Version, ctl: &[u8]) -> Vec<u8> {
        let mut out = (version as f64).to_le_bytes().to_vec();
        out.extend_from_slice(&ctl[9..]);
        out
    }

    #[test]
    fn field_metadata_reads_back_as_written() {
        let writer = Writer::new("refund|agent", "refund-1");
        let write = FieldWrite::new("order", "12345", WritePolicy::FirstWriter).content_type("text/plain; q=0.5");
        let ctl = control(&writer, 1_764_000_000_123, &write);
        assert_eq!(ctl[0], b'f');
        assert_eq!(f64::from_le_bytes(ctl[1..9].try_into().unwrap()), 0.0);
        assert_eq!(f64::from_le_bytes(ctl[9..17].try_into().unwrap()), 27.0);
        assert_eq!(ctl[17], 1);
        assert_eq!(&ctl[18..], b"1764000000123|12|8|refund|agentrefund-1text/plain; q=0.5");
        assert_eq!(
            parse_meta(&stored(42, &ctl)),
            Ok(Meta {
                version: 42,
                size: 27,
                locked: true,
                written_at_ms: 1_764_000_000_123,
                writer,
                content_type: "text/plain; q=0.5".into(),
            })
        );
        let cas =
            control(&Writer::new("a", "a-1"), 5, &FieldWrite::new("n", "", WritePolicy::CompareAndSet { expected: 9 }));
        assert_eq!((cas[0], f64::from_le_bytes(cas[1..9].try_into().unwrap()), cas[17]), (b'c', 9.0, 0));
        let plain =
            stored(7, &control(&Writer::new("a", "a-1"), 5, &FieldWrite::new("n", "", WritePolicy::LastWriter)));
        let meta = parse_meta(&plain).unwrap();
        assert_eq!((meta.version, meta.size, meta.locked, meta.written_at_ms), (7, 1, false, 5));
        let mut locked_two = plain.clone();
        locked_two[16] = 2;
        let mut half = plain.clone();
        half[..8].copy_from_slice(&7.5f64.to_le_bytes());
        for bad in [&b""[..], &plain[..16], &plain[..20], &locked_two, &half, &stored(7, &[b'l'; 30])] {
            assert!(matches!(parse_meta(bad), Err(SessionError::Corrupt(_))), "{bad:?}");
        }
    }

    #[test]
    fn the_header_holds_the_version_first() {
        let mut head = Vec::new();
        for x in [12.0f64, 300.0, 2.0, 1_764_000_000_123.0] {
            head.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(header_version(&head), Ok(12));
        assert!(matches!(header_version(&head[..24]), Err(SessionError::Corrupt(_))));
    }

    #[test]
    fn the_scripts_carry_the_limits() {
        let limits = Limits { ttl: Duration::from_secs(3), ..Limits::default() };
        let script = put_script(&limits);
        assert!(!script.contains('@') && !delete_script().contains('@'));
        assert!(script.contains(">= 300 or e - now >= 300") && script.contains("PEXPIRE', h, '3000')"));
        assert!(script.contains(">= 10000 then return {'sessions'}") && script.contains("> 1048576 then"));
        assert!(script.contains("'MAXLEN', '~', '1000'") && delete_script().contains("PEXPIRE', log, '60000')"));
    }
}
