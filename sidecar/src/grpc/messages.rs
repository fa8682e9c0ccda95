//! Reading a streamed gRPC body message by message (the A2A pass-through reads an agent's
//! streamed answer, and the caller's sidecar the chunks of a streamed mesh call): each
//! length-prefixed message as it completes, then the trailers.

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;

use super::{Body, PREFIX_LEN};

/// What a body read next.
#[derive(Debug)]
pub(crate) enum Read {
    Message(Bytes),
    /// The body ended, with its trailers if it had any.
    End(Option<HeaderMap>),
}

/// The messages of a gRPC body, each at most `limit` bytes, uncompressed.
pub(crate) struct MessageReader {
    body: Body,
    buf: BytesMut,
    limit: usize,
}

impl MessageReader {
    pub(crate) fn new(body: Body, limit: usize) -> MessageReader {
        MessageReader { body, buf: BytesMut::new(), limit }
    }

    /// The next whole message, or the end; `Err` says why the body cannot be read on.
    pub(crate) async fn next(&mut self) -> Result<Read, String> {
        loop {
            if let Some(message) = self.take()? {
                return Ok(Read::Message(message));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => {
                        if !self.buf.is_empty() {
                            return Err(format!("the stream ended within a message ({} bytes)", self.buf.len()));
                        }
                        return Ok(Read::End(frame.into_trailers().ok()));
                    }
                },
                Some(Err(e)) => return Err(format!("the stream broke: {e}")),
                None if self.buf.is_empty() => return Ok(Read::End(None)),
                None => return Err(format!("the stream ended within a message ({} bytes)", self.buf.len())),
            }
        }
    }

    /// A whole message at the front of the buffer, if there is one.
    fn take(&mut self) -> Result<Option<Bytes>, String> {
        if self.buf.len() < PREFIX_LEN {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err("a compressed message (the mesh sends and takes identity encoding)".into());
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.limit {
            return Err(format!("a message of {len} bytes, over the limit of {}", self.limit));
        }
        if self.buf.len() < PREFIX_LEN + len {
            return Ok(None);
        }
        self.buf.advance(PREFIX_LEN);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::ChannelBody;
    use super::*;

    fn frame(msg: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    /// A body of `chunks`, then `trailers`.
    fn body(chunks: Vec<Vec<u8>>, trailers: Option<HeaderMap>) -> Body {
        let (tx, body) = ChannelBody::new(chunks.len() + 1);
        for c in chunks {
            tx.try_send(Ok(http_body::Frame::data(Bytes::from(c)))).unwrap();
        }
        if let Some(t) = trailers {
            tx.try_send(Ok(http_body::Frame::trailers(t))).unwrap();
        }
        Body::Channel(body)
    }

    #[tokio::test]
    async fn messages_split_anywhere_read_back_whole_then_the_trailers() {
        let mut wire = frame(b"one");
        wire.extend(frame(b""));
        wire.extend(frame(b"three"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        for split in 1..wire.len() {
            let chunks: Vec<Vec<u8>> = wire.chunks(split).map(<[u8]>::to_vec).collect();
            let mut reader = MessageReader::new(body(chunks, Some(trailers.clone())), 16);
            let mut got = Vec::new();
            loop {
                match reader.next().await.unwrap() {
                    Read::Message(m) => got.push(m),
                    Read::End(t) => {
                        assert_eq!(t.unwrap()["grpc-status"], "0");
                        break;
                    }
                }
            }
            assert_eq!(got, [&b"one"[..], b"", b"three"], "split {split}");
        }
    }

    #[tokio::test]
    async fn a_cut_oversized_or_compressed_message_is_refused() {
        let cut = frame(b"hello")[..6].to_vec();
        let err = MessageReader::new(body(vec![cut], None), 16).next().await.unwrap_err();
        assert_eq!(err, "the stream ended within a message (6 bytes)");
        let err = MessageReader::new(body(vec![frame(&[7; 17])], None), 16).next().await.unwrap_err();
        assert_eq!(err, "a message of 17 bytes, over the limit of 16");
        let mut compressed = frame(b"x");
        compressed[0] = 1;
        let err = MessageReader::new(body(vec![compressed], None), 16).next().await.unwrap_err();
        assert!(err.starts_with("a compressed message"), "{err}");
        assert!(matches!(MessageReader::new(body(vec![], None), 16).next().await, Ok(Read::End(None))));
    }
}
