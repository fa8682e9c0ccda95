//! `agent-reach ctl session show <id>`: one session's context as the control service keeps
//! it (fields, versions, writers, locks), for operators, read through the Admin API's
//! `GetSession` (viewer role; so it works with mutual TLS and operator tokens like every
//! other `ctl` command). Reads only; writes are the agents' (through their sidecars).

use std::io::Write;

use agent_reach::proto;
use serde::Serialize;
use tonic::Status;

use crate::output::{CtlError, row, table};

/// Longest value shown in the table; longer or binary values show their size.
const SHOWN_VALUE_CHARS: usize = 60;

#[derive(Serialize)]
struct Shown {
    session_id: String,
    tenant: String,
    version: u64,
    fields: Vec<ShownField>,
}

#[derive(Serialize)]
struct ShownField {
    name: String,
    version: u64,
    writer_agent: String,
    writer_instance: String,
    written_at_ms: u64,
    locked: bool,
    content_type: String,
    /// The value as UTF-8 when it is, else absent (see `value_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    value_bytes: usize,
}

/// Prints session `id` of `tenant` from the Admin API's `GetSession` reply.
pub fn show(
    tenant: String,
    id: String,
    reply: proto::GetSessionReply,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    if !reply.found {
        return Err(CtlError::Api(Status::not_found(format!("tenant {tenant} has no session {id:?}"))));
    }
    let shown = Shown {
        session_id: id,
        tenant,
        version: reply.version,
        fields: reply
            .fields
            .into_iter()
            .map(|f| ShownField {
                value_bytes: f.value.len(),
                value: std::str::from_utf8(&f.value).ok().map(str::to_string),
                name: f.name,
                version: f.version,
                writer_agent: f.writer_agent,
                writer_instance: f.writer_instance,
                written_at_ms: f.written_at_ms,
                locked: f.locked,
                content_type: f.content_type,
            })
            .collect(),
    };
    if json {
        serde_json::to_writer_pretty(&mut *out, &shown).map_err(|e| CtlError::Io(e.into()))?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "session {} (tenant {}) at version {}", shown.session_id, shown.tenant, shown.version)?;
    let mut rows = vec![row(["FIELD", "VERSION", "WRITER", "POLICY", "VALUE"])];
    for f in &shown.fields {
        let value = match &f.value {
            Some(text) if text.chars().count() <= SHOWN_VALUE_CHARS && !text.contains('\n') => text.clone(),
            _ => format!("<{} bytes>", f.value_bytes),
        };
        let policy = if f.locked { "locked (first writer)" } else { "" };
        rows.push(vec![
            f.name.clone(),
            f.version.to_string(),
            format!("{}/{}", f.writer_agent, f.writer_instance),
            policy.to_string(),
            value,
        ]);
    }
    out.write_all(table(&rows).as_bytes())?;
    Ok(())
}
