//! What `agent-reach ctl` prints and how it fails: the error type with its exit code, and
//! the aligned tables of its commands. A leaf: it imports nothing of the CLI.

use std::fmt::Write as _;

use agent_reach::reason::{META_FIELD, error_info};
use tonic::{Code, Status};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The command line or an input file is wrong.
    #[error("{0}")]
    Usage(String),
    /// The control service refused or failed the request.
    #[error("{}", describe(.0))]
    Api(Status),
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
}

impl CtlError {
    /// 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Usage(_) => 2,
            CtlError::Api(s) if s.code() == Code::InvalidArgument => 2,
            _ => 1,
        }
    }
}

/// "REASON: message (field x)", as the API says it.
fn describe(status: &Status) -> String {
    match error_info(status) {
        Some(info) => match info.metadata.get(META_FIELD) {
            Some(field) => format!("{}: {} (field {field})", info.reason, status.message()),
            None => format!("{}: {}", info.reason, status.message()),
        },
        None => format!("{:?}: {}", status.code(), status.message()),
    }
}

pub(crate) fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Left-aligned columns separated by two spaces; the first row is the header.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[c]);
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}
