//! Connection flags shared by every state store command.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use mqkv_client::{Client, ClientOptions, TlsSettings};

#[derive(Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// Broker host name or address.
    #[arg(long, env = "MQKV_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Broker port.
    #[arg(long, env = "MQKV_PORT", default_value_t = 1883)]
    pub port: u16,
    /// MQTT client id (default: mqkv-<random>). Also the holder name of locks and leadership.
    #[arg(long, env = "MQKV_CLIENT_ID")]
    pub client_id: Option<String>,
    /// User name for the broker.
    #[arg(long, env = "MQKV_USERNAME")]
    pub username: Option<String>,
    /// Password for the broker.
    #[arg(long, env = "MQKV_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// How long to wait for each answer, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Connects over TLS, trusting the CA certificates in this PEM file (a private CA's, or
    /// the system's bundle); give the TLS listener's port with --port.
    #[arg(long, env = "MQKV_CAFILE", value_name = "FILE")]
    pub cafile: Option<PathBuf>,
    /// Connects over WebSocket, to the path given (`--ws=/path`) or to `/mqtt`; with
    /// --cafile, over secure WebSocket. Give the WebSocket listener's port with --port.
    #[arg(
        long,
        env = "MQKV_WS",
        value_name = "PATH",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "/mqtt"
    )]
    pub ws: Option<String>,
    /// A client certificate chain (PEM) for a TLS listener that asks for one; needs --key.
    #[arg(
        long = "cert",
        env = "MQKV_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long = "key",
        env = "MQKV_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
}

impl ConnectionArgs {
    /// The TLS settings of --cafile, --cert and --key, if TLS is asked for.
    pub fn tls(&self) -> anyhow::Result<Option<TlsSettings>> {
        let client = self.client_cert.as_deref().zip(self.client_key.as_deref());
        match &self.cafile {
            Some(ca) => Ok(Some(TlsSettings::from_files(ca, client)?)),
            None if client.is_some() => anyhow::bail!("--cert and --key need --cafile"),
            None => Ok(None),
        }
    }

    pub fn options(&self) -> anyhow::Result<ClientOptions> {
        let mut options = ClientOptions::new(self.host.clone(), self.port)
            .request_timeout(Duration::from_millis(self.timeout));
        if let Some(tls) = self.tls()? {
            options = options.tls(tls);
        }
        if let Some(path) = &self.ws {
            options = options.websocket(path.clone());
        }
        if let Some(id) = &self.client_id {
            options = options.client_id(id.clone());
        }
        match (&self.username, &self.password) {
            (Some(user), password) => {
                options = options.credentials(user.clone(), password.clone().unwrap_or_default());
            }
            (None, Some(_)) => anyhow::bail!("--password needs --username"),
            (None, None) => {}
        }
        Ok(options)
    }

    pub async fn connect(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(self.options()?).await?)
    }
}
