//! `mica._mica`: the native module of the `mica` Python package (PyO3, abi3), built on the
//! `mica` facade crate. It holds what needs Rust — opening models, the engine, event
//! streams, logits as numpy arrays, the store, conversion, the HTTP server — and the
//! Python package (`python/mica`) shapes it into the public API (OpenAI-shaped dicts,
//! generators, exceptions).

mod convert;
mod errors;
mod model;
mod params;
mod server;
mod store;
mod stream;
mod structured;

use pyo3::prelude::*;

#[pymodule]
fn _mica(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::NativeModel>()?;
    m.add_class::<stream::EventStream>()?;
    m.add_class::<server::NativeServer>()?;
    m.add_class::<structured::NativeStructured>()?;
    m.add_class::<structured::NativeToolStream>()?;
    m.add_function(wrap_pyfunction!(store::resolve, m)?)?;
    m.add_function(wrap_pyfunction!(store::pull, m)?)?;
    m.add_function(wrap_pyfunction!(store::list_models, m)?)?;
    m.add_function(wrap_pyfunction!(store::store_dir, m)?)?;
    m.add_function(wrap_pyfunction!(convert::convert, m)?)?;
    m.add_function(wrap_pyfunction!(server::discover, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
