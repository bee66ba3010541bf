//! The HTTP side: [`Hub`], the client every download goes through, and the model hub's
//! layout.
//!
//! The hub serves files at `{endpoint}/{org}/{repo}/resolve/main/{file}` and a repository's
//! file list at `{endpoint}/api/models/{org}/{repo}?blobs=true`, whose LFS entries carry each
//! file's sha256; `endpoint` is [`HUB_ENDPOINT`] unless the [`HubConfig`] names a mirror
//! (or a test server). A token, when configured, is sent to the hub only, never to the
//! wheel mirrors or direct URLs fetched through the same client.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// The model hub's base URL; the one place it is written.
pub const HUB_ENDPOINT: &str = "https://huggingface.co";

/// Where hub requests go, with which token, and which TLS roots to trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Base URL of the hub, without a trailing `/`: [`HUB_ENDPOINT`] or a mirror.
    pub endpoint: String,
    /// Access token for gated or private repositories (sent as `Authorization: Bearer`).
    pub token: Option<String>,
    /// A PEM bundle of root certificates tried before the system's usual bundles (what
    /// `SSL_CERT_FILE` names, for the `mica` binary).
    pub ca_file: Option<PathBuf>,
}

impl Default for HubConfig {
    /// The public hub, no token, the system's TLS roots.
    fn default() -> HubConfig {
        HubConfig {
            endpoint: HUB_ENDPOINT.to_string(),
            token: None,
            ca_file: None,
        }
    }
}

/// The HTTP client for the hub, wheel mirrors and direct model URLs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Default for Hub {
    fn default() -> Hub {
        Hub::new(HubConfig::default())
    }
}

impl Hub {
    /// A client for `config`. HTTP statuses come back as responses (so errors can be
    /// worded here), connecting and each read are bounded (a stalled transfer fails
    /// instead of hanging), and TLS roots come from `config.ca_file`, else the system
    /// bundle, so that corporate or sandbox CAs trusted by the OS (and by pip) are trusted
    /// here too; the bundled Mozilla roots when there is none (e.g. Windows).
    pub fn new(config: HubConfig) -> Hub {
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(root_certs(config.ca_file))
            .build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("mica/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls)
            .build()
            .new_agent();
        Hub {
            endpoint: config.endpoint.trim().trim_end_matches('/').to_string(),
            token: config.token.filter(|t| !t.trim().is_empty()),
            agent,
        }
    }

    /// The hub's base URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    pub(crate) fn file_url(&self, repo: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/main/{file}", self.endpoint)
    }

    fn api_url(&self, repo: &str) -> String {
        format!("{}/api/models/{repo}?blobs=true", self.endpoint)
    }

    /// The files of `repo` (`ORG/REPO`), from the hub's file list.
    pub(crate) fn list_repo(&self, repo: &str) -> Result<Vec<RepoFile>> {
        let url = self.api_url(repo);
        let mut req = self.agent.get(&url);
        if let Some(token) = &self.token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let mut resp = req.call().map_err(|e| Error::HubUnreachable {
            endpoint: self.endpoint.clone(),
            error: Box::new(e),
        })?;
        let status = resp.status().as_u16();
        let repo_s = || repo.to_string();
        match status {
            200 => {}
            401 | 403 => {
                return Err(Error::Refused {
                    what: format!("hf:{repo}"),
                    status,
                });
            }
            404 => return Err(Error::RepoNotFound { repo: repo_s() }),
            _ => {
                return Err(Error::ListingStatus {
                    repo: repo_s(),
                    status,
                    url,
                });
            }
        }
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| Error::ListingRead {
                repo: repo_s(),
                source: Box::new(e),
            })?;
        parse_listing(&body).map_err(|problem| Error::BadListing {
            repo: repo_s(),
            problem,
        })
    }

    /// The sha256 the hub publishes for `repo`'s `file`; `Err` when the list cannot be had.
    pub(crate) fn sha256_of(&self, repo: &str, file: &str) -> Result<Option<String>> {
        Ok(self
            .list_repo(repo)?
            .into_iter()
            .find(|f| f.name == file)
            .and_then(|f| f.sha256))
    }
}

/// The first readable PEM bundle among `ca_file` and the usual system locations; the
/// bundled Mozilla roots when there is none.
fn root_certs(ca_file: Option<PathBuf>) -> ureq::tls::RootCerts {
    const BUNDLES: &[&str] = &[
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ];
    for path in ca_file.into_iter().chain(BUNDLES.iter().map(PathBuf::from)) {
        let Ok(pem) = fs::read(&path) else { continue };
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert.to_owned()),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return ureq::tls::RootCerts::new_with_certs(&certs);
        }
    }
    ureq::tls::RootCerts::WebPki
}

/// A parsed `hf:ORG/REPO[:FILE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfRef {
    /// `ORG/REPO`.
    pub repo: String,
    pub file: Option<String>,
}

impl HfRef {
    /// Parses `hf:ORG/REPO[:FILE]`; `None` when `spec` is not of that form. Each part is
    /// letters, digits, `-`, `_` and `.` (never `.` or `..` alone), so a name cannot climb
    /// out of the store; FILE may have `/`-separated parts.
    pub fn parse(spec: &str) -> Option<HfRef> {
        let rest = spec.strip_prefix("hf:")?;
        let (repo, file) = match rest.split_once(':') {
            Some((r, f)) => (r, Some(f)),
            None => (rest, None),
        };
        let (org, name) = repo.split_once('/')?;
        let ok = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok(org) || !ok(name) {
            return None;
        }
        let file = match file {
            Some(f) if f.is_empty() || f.split('/').any(|p| !ok(p)) => return None,
            f => f.map(str::to_string),
        };
        Some(HfRef {
            repo: repo.to_string(),
            file,
        })
    }
}

/// One file of a hub repository, from the file list.
#[derive(Debug, Clone)]
pub(crate) struct RepoFile {
    pub(crate) name: String,
    pub(crate) size: Option<u64>,
    pub(crate) sha256: Option<String>,
}

/// The `siblings` of a file-list document; `Err` says what is wrong with it.
fn parse_listing(body: &str) -> std::result::Result<Vec<RepoFile>, String> {
    let json: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let siblings = json
        .get("siblings")
        .and_then(|s| s.as_array())
        .ok_or("no `siblings` list")?;
    Ok(siblings
        .iter()
        .filter_map(|s| {
            let name = s.get("rfilename")?.as_str()?.to_string();
            let lfs = s.get("lfs");
            let sha256 = lfs
                .and_then(|l| l.get("sha256"))
                .and_then(|h| h.as_str())
                .map(str::to_ascii_lowercase);
            let size = lfs
                .and_then(|l| l.get("size"))
                .or_else(|| s.get("size"))
                .and_then(|v| v.as_u64());
            Some(RepoFile { name, size, sha256 })
        })
        .collect())
}

/// The files to fetch from a repository when no file is named: its GGUF file (the Q4_K_M
/// one when there are several), or, without GGUF files, its safetensors weights with the
/// JSON configs, tokenizer and chat template next to them.
pub(crate) fn choose_files(repo: &str, list: Vec<RepoFile>) -> Result<Vec<RepoFile>> {
    let ggufs: Vec<&RepoFile> = list.iter().filter(|f| f.name.ends_with(".gguf")).collect();
    match ggufs.len() {
        1 => return Ok(vec![ggufs[0].clone()]),
        0 => {}
        _ => {
            let q4km: Vec<&&RepoFile> = ggufs
                .iter()
                .filter(|f| f.name.to_ascii_lowercase().contains("q4_k_m"))
                .collect();
            if q4km.len() == 1 {
                return Ok(vec![(*q4km[0]).clone()]);
            }
            return Err(Error::SeveralGguf {
                repo: repo.into(),
                files: ggufs.iter().map(|f| f.name.clone()).collect(),
            });
        }
    }
    let weights = list.iter().any(|f| f.name.ends_with(".safetensors"));
    if !weights {
        return Err(Error::NoWeights { repo: repo.into() });
    }
    let wanted = |n: &str| {
        !n.contains('/')
            && (n.ends_with(".safetensors")
                || n.ends_with(".json")
                || n == "tokenizer.model"
                || n.ends_with(".jinja"))
    };
    Ok(list.into_iter().filter(|f| wanted(&f.name)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hub_names() {
        let r = HfRef::parse("hf:Org/Repo-GGUF:model.Q4_K_M.gguf").unwrap();
        assert_eq!(r.repo, "Org/Repo-GGUF");
        assert_eq!(r.file.as_deref(), Some("model.Q4_K_M.gguf"));
        assert_eq!(HfRef::parse("hf:a/b").unwrap().file, None);
        assert_eq!(
            HfRef::parse("hf:a/b:sub/x.gguf").unwrap().file.as_deref(),
            Some("sub/x.gguf")
        );
        for bad in [
            "hf:",
            "hf:abc",
            "hf:a/",
            "hf:/b",
            "hf:a/b:",
            "hf:../b",
            "hf:a/b:../x",
            "hf:a b/c",
        ] {
            assert!(HfRef::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn parses_listing() {
        let body = r#"{"siblings":[{"rfilename":"a.gguf","size":10,"lfs":{"sha256":"AB","size":10}},{"rfilename":"README.md","size":5}]}"#;
        let list = parse_listing(body).unwrap();
        assert_eq!(list[0].sha256.as_deref(), Some("ab"));
        assert_eq!(list[1].size, Some(5));
        assert_eq!(list[1].sha256, None);
        assert!(parse_listing("{}").unwrap_err().contains("siblings"));
    }

    #[test]
    fn picks_files() {
        let f = |n: &str| RepoFile {
            name: n.into(),
            size: None,
            sha256: None,
        };
        let one = choose_files("o/r", vec![f("x-Q8_0.gguf"), f("x-Q4_K_M.gguf")]).unwrap();
        assert_eq!(one[0].name, "x-Q4_K_M.gguf");
        let e = choose_files("o/r", vec![f("a.gguf"), f("b.gguf")]).unwrap_err();
        assert!(e.to_string().contains("hf:o/r:FILE"), "{e}");
        let st = choose_files(
            "o/r",
            vec![
                f("model.safetensors"),
                f("config.json"),
                f("README.md"),
                f("sub/x.json"),
            ],
        )
        .unwrap();
        let names: Vec<_> = st.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["model.safetensors", "config.json"]);
        assert!(choose_files("o/r", vec![f("README.md")]).is_err());
    }

    #[test]
    fn config_is_normalised() {
        let hub = Hub::new(HubConfig {
            endpoint: " http://127.0.0.1:9/ ".into(),
            token: Some("  ".into()),
            ca_file: None,
        });
        assert_eq!(hub.endpoint(), "http://127.0.0.1:9");
        assert_eq!(hub.token(), None);
        assert_eq!(
            hub.file_url("o/r", "f.gguf"),
            "http://127.0.0.1:9/o/r/resolve/main/f.gguf"
        );
    }
}
