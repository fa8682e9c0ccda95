//! The mesh hop's routing header, `ar-hop`: what the target's sidecar needs to find the
//! call's instance and check the call (the instance, the caller's tenant, the capability
//! routed by and the caller its sidecar verified) in one header instead of five. Each
//! header of a call costs about a thousand instructions on each side (HPACK encoding,
//! decoding, the header map); these change only with the instance and the caller, so one
//! HPACK-indexed header carries them as cheaply as one of the five did.
//!
//! The value is the five fields in that order, joined by `|`; the capability and the caller
//! (agent and instance, both or neither) may be empty. Names never hold `|` (see
//! [`agent_reach::model::validate_name`]); a field with any byte a name cannot have makes
//! the call go with the separate headers instead.
//!
//! Who sends it: a call with the separate headers carries a token of its connection in
//! [`agent_reach::headers::HOP_ASK`]; a sidecar that reads `ar-hop` echoes it in
//! [`agent_reach::headers::HOP_OK`] on its answer, and the calling sidecar uses `ar-hop` on
//! that connection from then on ([`crate::pool::Conn::speaks_hop`]). A sidecar that
//! predates the header never answers, and keeps getting the separate headers; a new
//! connection starts with them again. The agent behind a sidecar never sees the token (no
//! `ar-` header is passed to it), so an answer of its own cannot make the calling sidecar
//! switch. A request with both forms is refused.
//!
//! A sixth field, `w` or absent, says the calling sidecar reads a unary answer *whole*: its
//! status and load in the answer's headers, the message in DATA ending the stream, no
//! trailers block (one HEADERS block fewer to encode, send and decode per call; see
//! [`crate::inbound::deliver`]). A caller's sidecar that reads it asks with a token ending
//! in [`WHOLE_MARK`]; a target's sidecar that writes it echoes the token with one more
//! `WHOLE_MARK`, and only a calling sidecar that got that echo sends the sixth field. A
//! sidecar of the previous version echoes the token as it came (the caller then sends five
//! fields and reads gRPC's answers), and is never sent a sixth field, which it would refuse.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};

/// The routing fields of a mesh call, borrowed from wherever they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hop<'a> {
    pub instance: &'a str,
    pub tenant: &'a str,
    pub capability: &'a str,
    /// The caller's agent and instance, as its sidecar verified them.
    pub caller: Option<(&'a str, &'a str)>,
    /// The calling sidecar reads a unary answer whole (the sixth field).
    pub whole: bool,
}

const SEPARATOR: u8 = b'|';
const WRONG_COUNT: &str = "must have 5 fields separated by '|': instance, tenant, capability, caller agent, caller \
                           instance (and a sixth, `w`, or none)";
/// The sixth field of a call whose sidecar reads a unary answer whole.
const WHOLE_FIELD: &str = "w";
/// Ends an `ar-hop-ask` token of a sidecar that reads whole answers; one more ends the
/// echo of a sidecar that writes them.
pub(crate) const WHOLE_MARK: u8 = b'+';

/// The tenant field of an `ar-hop` value (its second), without reading the rest: what the
/// mesh port checks against the peer's certificate before the call is delivered, where
/// [`Hop::parse`] reads the whole value and refuses a malformed one. For a well-formed
/// value it is `parse`'s tenant.
fn tenant_field(value: &HeaderValue) -> Result<&str, &'static str> {
    let mut fields = value.as_bytes().splitn(3, |b| *b == SEPARATOR);
    let (Some(_), Some(tenant), Some(_)) = (fields.next(), fields.next(), fields.next()) else {
        return Err(WRONG_COUNT);
    };
    std::str::from_utf8(tenant).map_err(|_| "is not visible ASCII")
}

/// A byte a name may hold: letters, digits, `.`, `_`, `-`, `:` (tenants are a subset).
fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':')
}

impl<'a> Hop<'a> {
    fn fields(&self) -> [&'a str; 5] {
        let (agent, instance) = self.caller.unwrap_or_default();
        [self.instance, self.tenant, self.capability, agent, instance]
    }

    /// The `ar-hop` value; `None` when a field holds a byte no name has (the call then goes
    /// with the separate headers).
    pub(crate) fn value(&self) -> Option<HeaderValue> {
        let fields = self.fields();
        let len = fields.iter().map(|f| f.len() + 1).sum::<usize>() + 2;
        let mut out = BytesMut::with_capacity(len);
        for (i, field) in fields.iter().enumerate() {
            if !field.bytes().all(name_byte) {
                return None;
            }
            if i > 0 {
                out.put_u8(SEPARATOR);
            }
            out.put_slice(field.as_bytes());
        }
        if self.whole {
            out.put_u8(SEPARATOR);
            out.put_slice(WHOLE_FIELD.as_bytes());
        }
        // Only name bytes and `|`: a valid value, handed over without a copy.
        HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
    }

    /// Reads an `ar-hop` value; the error says what is wrong with it.
    pub(crate) fn parse(value: &'a HeaderValue) -> Result<Hop<'a>, &'static str> {
        let text = value.to_str().map_err(|_| "is not visible ASCII")?;
        // A byte loop: `str::split` costs several times as much on a value this short, and
        // this runs once per call.
        let mut fields = [""; 6];
        let (mut n, mut start) = (0, 0);
        for (i, &b) in text.as_bytes().iter().enumerate() {
            if b == SEPARATOR {
                if n == 5 {
                    return Err(WRONG_COUNT);
                }
                fields[n] = &text[start..i];
                (n, start) = (n + 1, i + 1);
            }
        }
        if n < 4 {
            return Err(WRONG_COUNT);
        }
        fields[n] = &text[start..];
        let [instance, tenant, capability, agent, caller, answer] = fields;
        let whole = match (n, answer) {
            (4, _) => false,
            (_, WHOLE_FIELD) => true,
            _ => return Err(WRONG_COUNT),
        };
        if instance.is_empty() {
            return Err("names no instance");
        }
        let caller = match (agent.is_empty(), caller.is_empty()) {
            (true, true) => None,
            (false, false) => Some((agent, caller)),
            _ => return Err("names the caller's agent or instance without the other"),
        };
        Ok(Hop { instance, tenant, capability, caller, whole })
    }
}

/// Whether an `ar-hop-ask` token (or its echo) ends with [`WHOLE_MARK`].
fn marks_whole(token: &[u8]) -> bool {
    token.last() == Some(&WHOLE_MARK)
}

/// What a sidecar that writes whole answers echoes for `token`: the token as it came, with
/// one more [`WHOLE_MARK`] when the asking sidecar reads them.
pub(crate) fn echo(token: &HeaderValue) -> HeaderValue {
    if !marks_whole(token.as_bytes()) {
        return token.clone();
    }
    let mut out = BytesMut::with_capacity(token.len() + 1);
    out.put_slice(token.as_bytes());
    out.put_u8(WHOLE_MARK);
    // A valid value with one more visible ASCII byte.
    HeaderValue::from_maybe_shared(out.freeze()).unwrap_or_else(|_| token.clone())
}

/// The tenant a mesh request claims and the header it is in: `ar-hop`, or `ar-tenant`
/// (the separate headers). A request with both is refused, so what is checked against the
/// peer's certificate is what the call is routed with.
pub(crate) fn claimed_tenant(headers: &HeaderMap) -> Result<Option<(&'static str, &str)>, String> {
    use agent_reach::headers as h;
    // Looked up by `HeaderName`: a `&str` name is parsed again on every lookup (about 330
    // instructions each under callgrind, for these two names on every mutual-TLS call).
    match (headers.get(crate::grpc::header::HOP), headers.get(crate::grpc::header::TENANT)) {
        (Some(_), Some(_)) => Err(format!("{} and {} both", h::HOP, h::TENANT)),
        (Some(hop), None) => {
            tenant_field(hop).map(|tenant| Some((h::HOP, tenant))).map_err(|why| format!("{} {why}", h::HOP))
        }
        (None, tenant) => Ok(tenant.map(|t| (h::TENANT, t.to_str().unwrap_or_default()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hop_reads_back_as_written() {
        let with_caller = Hop {
            instance: "i-1",
            tenant: "acme",
            capability: "bench.echo",
            caller: Some(("planner", "p-1")),
            whole: false,
        };
        let anonymous = Hop { instance: "i-2", tenant: "acme", capability: "", caller: None, whole: false };
        let whole = Hop { whole: true, ..with_caller };
        for hop in [with_caller, anonymous, whole] {
            let value = hop.value().unwrap();
            assert_eq!(Hop::parse(&value), Ok(hop));
        }
        assert_eq!(with_caller.value().unwrap(), "i-1|acme|bench.echo|planner|p-1");
        assert_eq!(anonymous.value().unwrap(), "i-2|acme|||");
        assert_eq!(whole.value().unwrap(), "i-1|acme|bench.echo|planner|p-1|w");
        assert_eq!(Hop { whole: true, ..anonymous }.value().unwrap(), "i-2|acme||||w");
    }

    #[test]
    fn a_field_no_name_could_hold_sends_the_separate_headers() {
        for bad in ["a|b", "a b", "a,b", "é"] {
            let hop = Hop { instance: "i", tenant: "t", capability: bad, caller: None, whole: false };
            assert_eq!(hop.value(), None, "{bad:?}");
            assert_eq!(Hop { capability: "c", caller: Some(("a", bad)), ..hop }.value(), None);
        }
    }

    #[test]
    fn a_malformed_hop_is_refused_with_its_reason() {
        let parse = |v: &'static str| Hop::parse(&HeaderValue::from_static(v)).map(|_| ());
        assert_eq!(
            parse("i|t|c|a"),
            Err(
                "must have 5 fields separated by '|': instance, tenant, capability, caller agent, caller instance (and \
                 a sixth, `w`, or none)"
            )
        );
        // A sixth field says the caller reads whole answers: `w`, nothing else.
        for bad in ["i|t|c|a|b|x", "i|t|c|a|b|", "i|t|c|a|b|w|", "i|t|c|a|b|w|w", "i|t|c|a|b|W"] {
            assert!(parse(bad).unwrap_err().starts_with("must have 5 fields"), "{bad:?}");
        }
        let read = |v: &'static str| Hop::parse(&HeaderValue::from_static(v)).map(|h| h.whole);
        assert_eq!(read("i|t|c|a|b|w"), Ok(true));
        assert_eq!(read("i|t||||w"), Ok(true));
        assert_eq!(read("i|t|c|a|b"), Ok(false));
        assert_eq!(parse("|t|c||"), Err("names no instance"));
        assert_eq!(parse("i|t|c|a|"), Err("names the caller's agent or instance without the other"));
        assert_eq!(parse("i|t|c||b"), Err("names the caller's agent or instance without the other"));
        assert_eq!(parse("i|t|||"), Ok(()));
    }

    #[test]
    fn the_echo_says_whole_answers_only_to_a_sidecar_that_asked_for_them() {
        let old = HeaderValue::from_static("00000000000000ab");
        let new = HeaderValue::from_static("00000000000000ab+");
        // A token of a sidecar that reads only gRPC's answers comes back as it came, which
        // is all that sidecar accepts.
        assert_eq!(echo(&old), old);
        assert_eq!(echo(&new), "00000000000000ab++");
        assert!(!marks_whole(old.as_bytes()) && marks_whole(new.as_bytes()));
    }

    #[test]
    fn the_claimed_tenant_comes_from_the_one_form_the_request_has() {
        use agent_reach::headers as h;
        let mut headers = HeaderMap::new();
        assert_eq!(claimed_tenant(&headers), Ok(None));
        headers.insert(h::TENANT, HeaderValue::from_static("acme"));
        assert_eq!(claimed_tenant(&headers), Ok(Some(("ar-tenant", "acme"))));
        headers.insert(h::HOP, HeaderValue::from_static("i|other|c||"));
        assert_eq!(claimed_tenant(&headers), Err("ar-hop and ar-tenant both".to_string()));
        headers.remove(h::TENANT);
        assert_eq!(claimed_tenant(&headers), Ok(Some(("ar-hop", "other"))));
        headers.insert(h::HOP, HeaderValue::from_static("i|other"));
        assert!(claimed_tenant(&headers).unwrap_err().starts_with("ar-hop must have 5 fields"));
    }

    #[test]
    fn the_claimed_tenant_is_the_tenant_parse_reads() {
        for value in ["i-1|acme|bench.echo|planner|p-1", "i-2|acme|||", "i|t|c|a|b", "i||c||"] {
            let value = HeaderValue::from_static(value);
            assert_eq!(tenant_field(&value), Ok(Hop::parse(&value).unwrap().tenant), "{value:?}");
        }
        // Malformed beyond the tenant: the claim is read, and delivery refuses the value.
        let long = HeaderValue::from_static("i|acme|c|a|b|x");
        assert_eq!(tenant_field(&long), Ok("acme"));
        assert!(Hop::parse(&long).is_err());
        for short in ["", "i", "i|acme"] {
            assert_eq!(tenant_field(&HeaderValue::from_static(short)), Err(WRONG_COUNT), "{short:?}");
        }
    }
}
