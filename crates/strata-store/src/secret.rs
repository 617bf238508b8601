//! The shared secret of Strata's network services (`strata serve`, `strata farmem serve`): how a
//! token is compared, and the rule that a service reachable from other hosts needs one.

use std::net::SocketAddr;

/// Longest token a service accepts, in bytes (a token file holds one line of at most this).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Compares without an early exit, so response time does not reveal a prefix of the token.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a service may not listen on `addr` with `token`, naming the options that set one
/// (`how`, e.g. `--token or STRATA_SERVE_TOKEN`): an address other hosts can reach needs a
/// token, and a token may be neither empty nor longer than [`MAX_TOKEN_BYTES`].
pub fn check_listen_token(addr: &SocketAddr, token: Option<&str>, how: &str) -> Result<(), String> {
    match token {
        None if !addr.ip().is_loopback() => Err(format!(
            "listen: {addr} is not a loopback address; set a token ({how}) before serving other hosts"
        )),
        Some("") => Err("token: empty".into()),
        Some(t) if t.len() > MAX_TOKEN_BYTES => Err(format!(
            "token: {} bytes, longer than the {MAX_TOKEN_BYTES} a token may have",
            t.len()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_every_byte_is() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn other_hosts_need_a_token() {
        let lo: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        let how = "--token";
        assert_eq!(check_listen_token(&lo, None, how), Ok(()));
        assert_eq!(
            check_listen_token(&any, None, how).unwrap_err(),
            "listen: 0.0.0.0:7000 is not a loopback address; set a token (--token) before serving other hosts"
        );
        assert_eq!(check_listen_token(&any, Some("t"), how), Ok(()));
        assert_eq!(
            check_listen_token(&lo, Some(""), how).unwrap_err(),
            "token: empty"
        );
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(check_listen_token(&lo, Some(&long), how)
            .unwrap_err()
            .starts_with("token: 4097 bytes"));
    }
}
