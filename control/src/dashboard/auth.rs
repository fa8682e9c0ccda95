//! Who may use the dashboard, and for what.
//!
//! Without operator tokens on this control (no `--admin-token-file`) the dashboard is
//! [`Access::LoopbackOnly`]: it listens on loopback addresses only (checked at start),
//! answers only requests naming a loopback host (so a web page elsewhere cannot reach it
//! through DNS rebinding) and changes nothing.
//!
//! With operator tokens ([`Access::Tokens`]) a person logs in with their Admin token:
//! `POST /api/login` with the token in a JSON body; the answer sets it as an `HttpOnly`,
//! `SameSite=Strict` cookie, so the token never appears in a URL, in the page's script or
//! in a log, and the page's event stream (an `EventSource`, which cannot set headers)
//! carries it like every other request. Every request is checked with
//! [`OperatorAuth::principal`] and [`Principal::authorize`], exactly as the Admin API
//! checks its bearer tokens: a viewer token sees its tenants, an operator token may also
//! validate and save policies, and each change is audit-logged like an Admin change.
//! Changes are POSTs with a JSON body, which a page of another site cannot send with the
//! cookie (`SameSite=Strict`, and a cross-site JSON POST needs a CORS preflight this server
//! never grants). Then the dashboard may listen beyond loopback; put TLS in front of it
//! there (the cookie is not marked `Secure`, as the listener speaks plain HTTP).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::error::ControlError;
use crate::identity::{Action, OperatorAuth, Principal};

/// The cookie carrying the token.
pub const COOKIE: &str = "agent_reach_session";
/// How long the browser keeps the cookie.
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(8 * 3600);

/// Why a request was refused.
#[derive(Debug)]
pub struct Denied {
    pub status: StatusCode,
    pub reason: String,
}

impl Denied {
    fn new(status: StatusCode, reason: impl Into<String>) -> Denied {
        Denied { status, reason: reason.into() }
    }
}

impl From<ControlError> for Denied {
    fn from(e: ControlError) -> Denied {
        let status = match &e {
            ControlError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ControlError::RoleNotAllowed { .. } | ControlError::TenantNotAllowed { .. } => StatusCode::FORBIDDEN,
            ControlError::PolicyNotFound { .. } => StatusCode::NOT_FOUND,
            ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Denied::new(status, e.to_string())
    }
}

/// See the module documentation.
pub enum Access {
    LoopbackOnly,
    Tokens(Arc<OperatorAuth>),
}

/// Who sent a request.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Anyone on this machine (loopback mode): may read, never change.
    Loopback,
    /// A logged-in operator token; the token itself, to check again later.
    Operator(Principal, String),
}

impl Caller {
    /// Whether the caller may do `action` on `tenant` (`None`: cluster-wide).
    pub fn may(&self, action: Action, tenant: Option<&str>) -> Result<(), Denied> {
        match self {
            Caller::Loopback if action == Action::Read => Ok(()),
            Caller::Loopback => Err(Denied::new(
                StatusCode::FORBIDDEN,
                "the dashboard changes nothing without operator tokens (start control with --admin-token-file)",
            )),
            Caller::Operator(who, _) => who.authorize(action, tenant).map_err(Denied::from),
        }
    }

    /// The principal behind the caller (loopback: an anonymous viewer).
    pub fn principal(&self) -> Principal {
        match self {
            Caller::Loopback => {
                Principal { name: "loopback".into(), role: crate::identity::Role::Viewer, tenants: vec![] }
            }
            Caller::Operator(who, _) => who.clone(),
        }
    }

    /// Whether `tenant` is among the tenants the caller may see.
    pub fn sees(&self, tenant: &str) -> bool {
        self.may(Action::Read, Some(tenant)).is_ok()
    }
}

/// Whether `host` (a `Host` header value) names this machine's loopback interface.
pub(super) fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(name, "localhost" | "[::1]") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// The token in the request's session cookie.
fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// Whether `token` can travel in a cookie as is (RFC 6265 cookie-octets).
fn cookie_safe(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\'))
}

impl Access {
    /// Whether the dashboard may listen beyond loopback.
    pub fn allows_remote(&self) -> bool {
        matches!(self, Access::Tokens(_))
    }

    /// Whether people log in.
    pub fn has_login(&self) -> bool {
        matches!(self, Access::Tokens(_))
    }

    /// Who sent the request.
    pub async fn caller(&self, headers: &HeaderMap) -> Result<Caller, Denied> {
        match self {
            Access::LoopbackOnly => {
                let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
                if loopback_host(host) {
                    Ok(Caller::Loopback)
                } else {
                    Err(Denied::new(
                        StatusCode::FORBIDDEN,
                        format!("the dashboard answers only to a loopback host name, not {host:?}"),
                    ))
                }
            }
            Access::Tokens(auth) => {
                let Some(token) = cookie_token(headers) else {
                    return Err(Denied::new(StatusCode::UNAUTHORIZED, "log in with an operator token"));
                };
                let bearer = format!("Bearer {token}");
                let who = auth.principal(Some(&bearer)).await?;
                Ok(Caller::Operator(who, token.to_string()))
            }
        }
    }

    /// Checks that `caller` still holds (its token may have been revoked or expired since).
    pub async fn recheck(&self, caller: &Caller) -> Result<(), Denied> {
        match (self, caller) {
            (Access::Tokens(auth), Caller::Operator(_, token)) => {
                auth.principal(Some(&format!("Bearer {token}"))).await.map(|_| ()).map_err(Denied::from)
            }
            _ => Ok(()),
        }
    }

    /// Logs in with `token`: its principal and the `Set-Cookie` value carrying it.
    pub async fn login(&self, token: &str) -> Result<(Principal, HeaderValue), Denied> {
        let Access::Tokens(auth) = self else {
            return Err(Denied::new(StatusCode::NOT_FOUND, "this dashboard has no login (no operator tokens)"));
        };
        let token = token.trim();
        if !cookie_safe(token) {
            return Err(Denied::new(StatusCode::UNAUTHORIZED, "unknown operator token"));
        }
        let who = auth.principal(Some(&format!("Bearer {token}"))).await?;
        let cookie =
            format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}", SESSION_MAX_AGE.as_secs());
        let value = HeaderValue::from_str(&cookie)
            .map_err(|_| Denied::new(StatusCode::UNAUTHORIZED, "unknown operator token"))?;
        Ok((who, value))
    }

    /// The `Set-Cookie` value that ends a session.
    pub fn logout_cookie() -> HeaderValue {
        HeaderValue::from_static("agent_reach_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts() {
        for host in ["127.0.0.1:7802", "localhost:7802", "[::1]:7802", "localhost", "127.0.0.2"] {
            assert!(loopback_host(host), "{host}");
        }
        for host in ["evil.example:7802", "10.0.0.1:7802", "", "localhost.evil.example", "127.0.0.1.nip.io:80"] {
            assert!(!loopback_host(host), "{host}");
        }
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; agent_reach_session=arat.ab.cd; b=2"));
        assert_eq!(cookie_token(&headers), Some("arat.ab.cd"));
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("agent_reach_sessionx=1; agent_reach_session="));
        assert_eq!(cookie_token(&headers), None);
        assert!(cookie_safe("arat.0a1b.x-Y_z"));
        for bad in ["", "a b", "a;b", "a,b", "a\"b", "a\\b", "é"] {
            assert!(!cookie_safe(bad), "{bad}");
        }
    }

    #[test]
    fn loopback_callers_read_but_never_change() {
        assert!(Caller::Loopback.may(Action::Read, Some("t")).is_ok());
        let refused = Caller::Loopback.may(Action::Change, Some("t")).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        let viewer = Caller::Operator(
            Principal { name: "token:1".into(), role: crate::identity::Role::Viewer, tenants: vec!["t".into()] },
            String::new(),
        );
        assert!(viewer.sees("t") && !viewer.sees("u"));
        assert_eq!(viewer.may(Action::Change, Some("t")).unwrap_err().status, StatusCode::FORBIDDEN);
    }
}
