//! Embedding routes: OpenAI's `POST /v1/embeddings` and Ollama's `POST /api/embed` (batch)
//! and older `POST /api/embeddings` (one prompt).
//!
//! Vectors come from the engine's [`Embedder`] (pooling as the model declares, last-token
//! for decoder LMs that declare none; see [`mica::engine::embed`]), one per model, made on
//! first use and shared by the requests one at a time (an embedding is one forward pass
//! over the input; it runs beside the generation engine's thread). `/v1/embeddings` and
//! `/api/embed` return L2-normalized vectors (as OpenAI's, llama.cpp's and Ollama's do);
//! the older `/api/embeddings` returns them unnormalized, as Ollama's does.
//!
//! OpenAI's `input` may be a string, a list of strings, a list of token ids or a list of
//! such lists; `encoding_format` is `float` or `base64` (little-endian f32 bytes);
//! `dimensions` is refused unless it is the model's own width (none of the models mica runs
//! is trained for truncated vectors). An input longer than the model's context is a 400
//! (Ollama's `truncate`, true by default, cuts it to the context instead).

use crate::body::JsonBody;
use crate::error::{ParamError, ServerError, parse_json};
use crate::models::Loaded;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use mica::engine::{EmbedError, Embedder};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Most inputs per request.
pub const MAX_INPUTS: usize = 2048;

/// OpenAI's `input`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Deserialize)]
pub struct OpenAiEmbedRequest {
    pub model: String,
    pub input: EmbedInput,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OllamaInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct OllamaEmbedRequest {
    pub model: String,
    pub input: OllamaInput,
    pub truncate: Option<bool>,
    pub dimensions: Option<i64>,
    pub options: Option<Value>,
    pub keep_alive: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct OllamaLegacyRequest {
    pub model: String,
    pub prompt: String,
    pub options: Option<Value>,
    pub keep_alive: Option<Value>,
}

/// An input as the embedder takes it.
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// Checks a token-id input against the vocabulary.
fn token_ids(ids: &[i64], field: &str, n_vocab: usize) -> Result<Vec<u32>, ParamError> {
    ids.iter()
        .map(|&t| {
            if t < 0 || t as usize >= n_vocab {
                Err(ParamError::Invalid {
                    field: field.to_string(),
                    rule: "token ids within the model's vocabulary",
                    got: t.to_string(),
                })
            } else {
                Ok(t as u32)
            }
        })
        .collect()
}

/// The OpenAI inputs as a list, validated (non-empty, at most [`MAX_INPUTS`]).
fn openai_inputs(input: &EmbedInput, n_vocab: usize) -> Result<Vec<Input>, ParamError> {
    let out: Vec<Input> = match input {
        EmbedInput::Text(s) => vec![Input::Text(s.clone())],
        EmbedInput::Texts(v) => v.iter().map(|s| Input::Text(s.clone())).collect(),
        EmbedInput::Tokens(ids) => vec![Input::Tokens(token_ids(ids, "input", n_vocab)?)],
        EmbedInput::TokenLists(v) => v
            .iter()
            .enumerate()
            .map(|(i, ids)| {
                Ok(Input::Tokens(token_ids(
                    ids,
                    &format!("input[{i}]"),
                    n_vocab,
                )?))
            })
            .collect::<Result<_, ParamError>>()?,
    };
    check_count(out.len())?;
    Ok(out)
}

fn check_count(n: usize) -> Result<(), ParamError> {
    if n == 0 {
        return Err(ParamError::Empty {
            field: "input".into(),
        });
    }
    if n > MAX_INPUTS {
        return Err(ParamError::TooMany {
            field: "input".into(),
            max: MAX_INPUTS,
            got: n,
        });
    }
    Ok(())
}

/// `dimensions` must be the model's width when given.
fn check_dimensions(dimensions: Option<i64>, n_embd: usize) -> Result<(), ParamError> {
    match dimensions {
        Some(d) if d != n_embd as i64 => Err(ParamError::Unsupported {
            field: "dimensions".into(),
            message: format!(
                "this model's embeddings have {n_embd} dimensions and it is not trained for shorter ones; leave dimensions out or set it to {n_embd}"
            ),
        }),
        _ => Ok(()),
    }
}

/// The vectors of `inputs` and their total token count. `truncate` cuts inputs to the
/// context; otherwise a longer input is a 400.
async fn embed_all(
    st: &AppState,
    loaded: Arc<Loaded>,
    inputs: Vec<Input>,
    normalize: bool,
    truncate: bool,
) -> Result<(Vec<Vec<f32>>, usize), ServerError> {
    let n_threads = st.cfg.n_threads;
    let job = move || -> Result<(Vec<Vec<f32>>, usize), ServerError> {
        let n_ctx = loaded.engine.n_ctx();
        let mut slot = loaded.embedder.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(
                Embedder::new(loaded.model.clone(), n_ctx, n_threads, None)
                    .map_err(|e| ServerError::InvalidRequest(e.to_string()))?,
            );
        }
        let Some(embedder) = slot.as_mut() else {
            return Err(ServerError::Internal("the embedder is missing".into()));
        };
        let mut out = Vec::with_capacity(inputs.len());
        let mut total = 0;
        for (i, input) in inputs.into_iter().enumerate() {
            let mut tokens = match input {
                Input::Tokens(t) => t,
                Input::Text(s) => loaded
                    .model
                    .tokenizer
                    .encode(&s, true, false)
                    .map_err(|e| ServerError::InvalidRequest(e.to_string()))?,
            };
            if truncate {
                tokens.truncate(n_ctx);
            }
            total += tokens.len();
            let field = if i == 0 {
                "input".to_string()
            } else {
                format!("input[{i}]")
            };
            let v = embedder.embed(&tokens, normalize).map_err(|e| match e {
                EmbedError::EmptyInput => ServerError::Param(ParamError::Empty { field }),
                EmbedError::TooLong { tokens, n_ctx } => {
                    ServerError::Param(ParamError::PromptTooLong {
                        field,
                        prompt: tokens,
                        n_ctx,
                    })
                }
                e @ EmbedError::UnsupportedPooling { .. } => {
                    ServerError::InvalidRequest(e.to_string())
                }
                e @ EmbedError::Engine(_) => ServerError::Generation(e.to_string()),
            })?;
            out.push(v);
        }
        Ok((out, total))
    };
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| ServerError::Internal(format!("embedding failed: {e}")))?
}

#[derive(Serialize)]
struct OpenAiEmbedding {
    object: &'static str,
    index: usize,
    embedding: Value,
}

#[derive(Serialize)]
struct OpenAiUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct OpenAiEmbeddings {
    object: &'static str,
    data: Vec<OpenAiEmbedding>,
    model: String,
    usage: OpenAiUsage,
}

/// Little-endian f32 bytes in base64 (what the `openai` SDK decodes).
pub fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `POST /v1/embeddings`.
pub async fn openai(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req: OpenAiEmbedRequest = parse_json(&body)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ParamError::Invalid {
                field: "encoding_format".into(),
                rule: "'float' or 'base64'",
                got: format!("'{other}'"),
            }
            .into());
        }
    };
    st.no_adapter(&req.model)?;
    let loaded = st.get(&req.model).await?;
    check_dimensions(req.dimensions, loaded.model.model.config.n_embd)?;
    let inputs = openai_inputs(&req.input, loaded.model.model.config.n_vocab)?;
    let (vectors, tokens) = embed_all(&st, loaded, inputs, true, false).await?;
    let data = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| OpenAiEmbedding {
            object: "embedding",
            index,
            embedding: if base64 {
                Value::String(base64_f32(v))
            } else {
                serde_json::json!(v)
            },
        })
        .collect();
    Ok(Json(OpenAiEmbeddings {
        object: "list",
        data,
        model: req.model,
        usage: OpenAiUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
    .into_response())
}

#[derive(Serialize)]
struct OllamaEmbed {
    model: String,
    embeddings: Vec<Vec<f32>>,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
}

/// `POST /api/embed`.
pub async fn ollama(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let t0 = Instant::now();
    let req: OllamaEmbedRequest = parse_json(&body)?;
    let texts = match req.input {
        OllamaInput::One(s) => vec![s],
        OllamaInput::Many(v) => v,
    };
    check_count(texts.len())?;
    st.no_adapter(&req.model)?;
    let loaded = st.get(&req.model).await?;
    let load = t0.elapsed();
    check_dimensions(req.dimensions, loaded.model.model.config.n_embd)?;
    let inputs = texts.into_iter().map(Input::Text).collect();
    let truncate = req.truncate.unwrap_or(true);
    let (embeddings, tokens) = embed_all(&st, loaded, inputs, true, truncate).await?;
    Ok(Json(OllamaEmbed {
        model: req.model,
        embeddings,
        total_duration: t0.elapsed().as_nanos() as u64,
        load_duration: load.as_nanos() as u64,
        prompt_eval_count: tokens,
    })
    .into_response())
}

#[derive(Serialize)]
struct OllamaLegacy {
    embedding: Vec<f32>,
}

/// `POST /api/embeddings` (Ollama's older route: one prompt, unnormalized vector).
pub async fn ollama_legacy(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req: OllamaLegacyRequest = parse_json(&body)?;
    st.no_adapter(&req.model)?;
    let loaded = st.get(&req.model).await?;
    let (mut v, _) = embed_all(&st, loaded, vec![Input::Text(req.prompt)], false, true).await?;
    Ok(Json(OllamaLegacy {
        embedding: v.pop().unwrap_or_default(),
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_of_every_shape() {
        let parse = |j: &str| serde_json::from_str::<EmbedInput>(j).unwrap();
        let n = |j: &str| openai_inputs(&parse(j), 100).map(|v| v.len());
        assert_eq!(n(r#""a""#), Ok(1));
        assert_eq!(n(r#"["a", "b"]"#), Ok(2));
        assert_eq!(n(r#"[1, 2, 3]"#), Ok(1));
        assert_eq!(n(r#"[[1], [2, 3]]"#), Ok(2));
        assert_eq!(n("[]").unwrap_err().field(), "input");
        assert_eq!(n(r#"[[1], [200]]"#).unwrap_err().field(), "input[1]");
        assert_eq!(n(r#"[-1]"#).unwrap_err().field(), "input");
    }

    #[test]
    fn dimensions_other_than_the_width_are_refused() {
        assert!(check_dimensions(None, 576).is_ok());
        assert!(check_dimensions(Some(576), 576).is_ok());
        let e = check_dimensions(Some(256), 576).unwrap_err();
        assert_eq!(e.field(), "dimensions");
        assert!(e.to_string().contains("576"));
    }

    #[test]
    fn base64_is_little_endian_f32() {
        // 1.0f32 = 00 00 80 3f
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
    }
}
