//! The `[farmem.serve]` config section: what `strata farmem serve` takes, checked here (the
//! listen address included) and turned into the server's [`ServerConfig`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::config::{check_address, ConfigError, Section, Size};

use crate::{ServerConfig, TransportKind};

/// A memory server lending RAM to compute processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServeOptions {
    /// HOST:PORT to listen on; port 0 picks a free one
    pub listen: String,
    /// bytes of memory to lend to compute processes
    pub capacity: Size,
    /// how data connections send chunks: tcp (socket writes) or uring (io_uring zero-copy
    /// sends of segment memory; on loopback the kernel copies them anyway, see the far-memory
    /// docs; falls back to writes, said on stderr, where io_uring or zero-copy is unavailable)
    pub transport: TransportKind,
    /// shared secret every client must send, required off loopback (default: --token-file, else
    /// $STRATA_FARMEM_TOKEN); visible to every user of this machine in ps, so prefer
    /// --token-file or the environment
    pub token: String,
    /// most connections served at once (a run opens one plus its data connections); more are
    /// answered busy and closed
    #[schemars(range(min = 1, max = 65536))]
    pub max_connections: u64,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: "127.0.0.1:7000".into(),
            capacity: Size(1 << 30),
            transport: TransportKind::Tcp,
            token: String::new(),
            max_connections: crate::DEFAULT_MAX_CONNECTIONS as u64,
        }
    }
}

impl Section for ServeOptions {
    const NAME: &'static str = "farmem.serve";

    fn validate(&self) -> Result<(), ConfigError> {
        check_address(Self::NAME, "listen", &self.listen)?;
        if self.capacity.0 == 0 {
            return Err(ConfigError::new(
                Self::NAME,
                "capacity",
                "must be positive, got 0",
            ));
        }
        Ok(())
    }
}

impl ServeOptions {
    /// The server's settings (its message size limit at its default).
    pub fn server_config(&self) -> ServerConfig {
        ServerConfig {
            listen: self.listen.clone(),
            capacity_bytes: self.capacity.0,
            transport: self.transport,
            token: Some(self.token.clone()).filter(|t| !t.is_empty()),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            ..ServerConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store::config::check;

    #[test]
    fn refusals_name_the_option() {
        let err = |v| check::<ServeOptions>(&v).unwrap_err().to_string();
        assert_eq!(
            err(serde_json::json!({"listen": "nowhere"})),
            "farmem.serve.listen: expected HOST:PORT such as 127.0.0.1:7000, got 'nowhere'"
        );
        assert_eq!(
            err(serde_json::json!({"capacity": 0})),
            "farmem.serve.capacity: must be positive, got 0"
        );
        assert!(err(serde_json::json!({"transport": "rdma"})).starts_with("farmem.serve.transport"));
        let ok = check::<ServeOptions>(&serde_json::json!({"capacity": "2G"})).unwrap();
        assert_eq!(ok.server_config().capacity_bytes, 2 << 30);
        let uring = check::<ServeOptions>(&serde_json::json!({"transport": "uring"})).unwrap();
        assert_eq!(uring.server_config().transport, TransportKind::Uring);
        assert_eq!(uring.server_config().token, None);
        let secret = check::<ServeOptions>(&serde_json::json!({"token": "s"})).unwrap();
        assert_eq!(secret.server_config().token.as_deref(), Some("s"));
        assert!(err(serde_json::json!({"max_connections": 0}))
            .starts_with("farmem.serve.max_connections"));
    }
}
