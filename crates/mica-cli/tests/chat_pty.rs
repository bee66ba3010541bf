//! `mica chat` driven as a person would drive it: in a pseudo-terminal (expectrl), with the
//! real SmolLM2-135M-Instruct model, greedy decoding. Covers a two-turn conversation whose
//! second answer depends on the first (and whose second prompt reuses the KV cache for
//! everything but the new message), the slash commands, and Ctrl-C during an answer.
//! Piped (non-terminal) input, multi-line messages and a full context are covered too.

mod common;

use common::*;
use expectrl::session::OsSession as Session;
use expectrl::{ControlCode, Eof, Expect, Regex};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

/// `mica chat ARGS` in a pseudo-terminal, its store in a scratch `MICA_HOME`.
fn spawn_chat(home: &str, args: &[&str]) -> Session {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mica"));
    cmd.arg("chat")
        .args(args)
        .env("MICA_HOME", scratch(home))
        .env("TERM", "xterm");
    let mut p = Session::spawn(cmd).expect("spawning mica chat in a pty");
    p.set_expect_timeout(Some(Duration::from_secs(240)));
    p
}

/// Sends `line` and waits for `want` in what follows.
fn say(p: &mut Session, line: &str, want: &str) -> String {
    p.send_line(line).unwrap();
    let caps = p
        .expect(want)
        .unwrap_or_else(|e| panic!("after {line:?}: expected {want:?}: {e}"));
    String::from_utf8_lossy(caps.before()).into_owned()
}

/// Sends a message and waits for its stats line; returns (answer text seen, generated
/// tokens, new prompt tokens, cached prompt tokens).
fn ask(p: &mut Session, line: &str) -> (String, usize, usize, usize) {
    p.send_line(line).unwrap();
    let caps = p
        .expect(Regex(
            r"\[(\d+) tokens, [^|]+\| prompt: (\d+) new \+ (\d+) cached tokens",
        ))
        .unwrap_or_else(|e| panic!("no stats line after {line:?}: {e}"));
    let num = |i: usize| -> usize {
        String::from_utf8_lossy(caps.get(i).unwrap())
            .parse()
            .unwrap()
    };
    let text = String::from_utf8_lossy(caps.before()).into_owned();
    assert!(!text.contains("panicked"), "{text}");
    (text, num(1), num(2), num(3))
}

#[test]
fn two_turns_commands_save_and_load() {
    let model = model_path(SMOLLM);
    let mut p = spawn_chat("pty-turns", &["-m", model.to_str().unwrap(), "-t", "2"]);
    p.expect(">>> ").unwrap();
    say(&mut p, "/temp 0", "temperature set to 0 (greedy)");
    say(
        &mut p,
        "/temp hot",
        "/temp V: a temperature from 0 (greedy) to 5",
    );
    say(
        &mut p,
        "/frobnicate",
        "unknown command /frobnicate; /help lists the commands",
    );
    say(&mut p, "/tokens 64", "at most 64 tokens per answer");

    let (a1, gen1, new1, cached1) = ask(&mut p, "My name is Ana. Please remember my name.");
    eprintln!("turn 1: {gen1} generated, prompt {new1} new + {cached1} cached\n{a1}");
    assert_eq!(cached1, 0, "nothing is cached before the first turn");
    assert!(gen1 > 1, "a nonempty first answer");
    let (a2, gen2, new2, cached2) = ask(&mut p, "What is my name?");
    eprintln!("turn 2: {gen2} generated, prompt {new2} new + {cached2} cached\n{a2}");
    // The second prompt is the first prompt, the first answer (whose final end-of-turn
    // token was sampled but never evaluated), and the new message: only the new message's
    // tokens (and that end-of-turn token) are processed.
    assert_eq!(
        cached2,
        new1 + gen1 - 1,
        "all of turn 1 reused from the KV cache"
    );
    assert!(new2 < 25, "only the new message processed: {new2}");
    assert!(a2.contains("Ana"), "the second answer uses the first: {a2}");

    let stats = say(&mut p, "/stats", "session: 2 answers");
    assert!(
        stats.contains(&format!("{cached2} reused from the cache, {new2} new")),
        "{stats}"
    );
    let file = scratch("pty-turns").join("chat.json");
    let file = file.to_str().unwrap();
    say(&mut p, &format!("/save {file}"), "saved 4 messages");
    say(&mut p, "/reset", "conversation cleared");
    say(&mut p, "/history", "(no messages yet)");
    say(&mut p, &format!("/load {file}"), "loaded 4 messages");
    say(&mut p, "/history", "you: What is my name?");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(
        saved["messages"][0]["content"],
        "My name is Ana. Please remember my name."
    );
    assert_eq!(saved["messages"][1]["role"], "assistant");

    // After /load the conversation goes on from the loaded turns.
    let (a3, _, _, _) = ask(&mut p, "Say my name again.");
    assert!(!a3.trim().is_empty());
    say(&mut p, "/system You are a pirate.", "system prompt set");
    say(&mut p, "/config", "system:       You are a pirate.");
    // A changed system prompt changes the start of the prompt: nothing can be reused.
    let (_, _, new4, cached4) = ask(&mut p, "Hello!");
    // (Only the template's opening and "You are a", shared with the default system prompt.)
    assert!(cached4 < 10 && new4 > 100, "{new4} new, {cached4} cached");
    p.send(ControlCode::EndOfTransmission).unwrap();
    p.expect(Eof).unwrap();
    // The line editor's history is kept in MICA_HOME for the next session.
    let history = std::fs::read_to_string(scratch("pty-turns").join("chat_history")).unwrap();
    assert!(
        history.contains("My name is Ana. Please remember my name."),
        "{history}"
    );
    assert!(history.contains("/system You are a pirate."), "{history}");
}

#[test]
fn ctrl_c_stops_the_answer_and_the_chat_goes_on() {
    let model = model_path(SMOLLM);
    let mut p = spawn_chat("pty-ctrlc", &["-m", model.to_str().unwrap(), "-t", "2"]);
    p.expect(">>> ").unwrap();
    say(&mut p, "/temp 0", "temperature set to 0");
    say(&mut p, "/tokens 4000", "at most 4000 tokens per answer");
    // Greedy SmolLM2 answers this with a loop that runs to the token limit (seen with
    // -t 2: "Eu estes, amo, amo, amo, ..."), so the answer is still going after the pause
    // however fast the machine is.
    p.send_line("My name is Ana and I live in Lisbon. Please remember that.")
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    p.send(ControlCode::EndOfText).unwrap();
    let caps = p
        .expect(Regex(r"\[stopped\]|Ctrl-D or /quit leaves|error: [^\r\n]*"))
        .unwrap();
    let seen = String::from_utf8_lossy(caps.before());
    let what = String::from_utf8_lossy(caps.get(0).unwrap());
    assert_eq!(
        what, "[stopped]",
        "Ctrl-C did not stop an answer; the terminal showed:\n{seen}"
    );
    p.expect(">>> ").unwrap();
    let stats = say(&mut p, "/stats", "stop: cancelled");
    let generated: usize = stats
        .split(" tokens generated")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stats}"));
    assert!(generated > 0 && generated < 4000, "{stats}");
    // Ctrl-C at the prompt does not leave either. Wait for the prompt: until the line editor
    // holds the terminal (raw mode), Ctrl-C is a SIGINT, which between answers means leave.
    p.expect(">>> ").unwrap();
    p.send(ControlCode::EndOfText).unwrap();
    p.expect("(Ctrl-D or /quit leaves)").unwrap();
    say(
        &mut p,
        "/history",
        "you: My name is Ana and I live in Lisbon.",
    );
    p.send_line("/quit").unwrap();
    p.expect(Eof).unwrap();
}

/// Runs `mica chat ARGS` with `input` piped to stdin; returns (success, stdout, stderr).
fn chat_piped(home: &std::path::Path, args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mica"))
        .arg("chat")
        .args(args)
        .env("MICA_HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.success(), stdout, stderr)
}

#[test]
fn piped_input_multiline_and_model_from_the_store() {
    // Without -m, the only model in the store is used.
    let home = scratch("piped");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let link = models.join("smollm2-135m-instruct-q4_1.gguf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(model_path(SMOLLM), &link).unwrap();
    let qwen = model_path("qwen2.5-coder-0.5b-instruct-awq-q4_k_m");
    let input = format!(
        "/model\n/temp 0\n/top-p 0.9\n/tokens 16\n\"\"\"\nline one\nline two\n\"\"\"\ncontinued \\\nhere\n/history\n/stats\n/bogus 1\n\
         /model no-such-model\n/model {}\n/model\n/config\n",
        qwen.display()
    );
    let (ok, out, err) = chat_piped(&home, &["-t", "2"], &input);
    assert!(ok, "{err}");
    assert!(out.contains("smollm2-135m-instruct ("), "{out}");
    assert!(out.contains("you: line one\nline two\n"), "{out}");
    assert!(out.contains("you: continued \nhere\n"), "{out}");
    assert!(out.contains("last answer: prompt"), "{out}");
    assert!(err.contains("unknown command /bogus"), "{err}");
    assert_eq!(
        err.matches(" cached tokens, ").count(),
        2,
        "two answers: {err}"
    );
}

#[test]
fn a_full_context_drops_the_oldest_turns() {
    let home = scratch("ctx");
    let model = model_path(SMOLLM);
    let m = model.to_str().unwrap();
    let msg = "Tell me one short fact about the sea, the sky, the mountains and the rivers.\n";
    let (ok, out, err) = chat_piped(
        &home,
        &[
            "-m",
            m,
            "-t",
            "2",
            "-c",
            "192",
            "-n",
            "24",
            "--temp",
            "0",
            "--system",
            "Be brief.",
        ],
        &format!("{msg}{msg}{msg}{msg}/history\n"),
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("[context full: dropped the 2 oldest messages"),
        "{err}"
    );
    assert!(
        out.contains("system: Be brief."),
        "the system prompt is kept: {out}"
    );
    // One message longer than the whole context: one error line, and the chat goes on.
    let long = "word ".repeat(400);
    let (ok, _, err) = chat_piped(
        &home,
        &["-m", m, "-t", "2", "-c", "192"],
        &format!("{long}\n/quit\n"),
    );
    assert!(ok, "{err}");
    assert!(err.contains("error: this message needs"), "{err}");
}

#[test]
fn without_m_the_user_picks_from_the_store() {
    let home = scratch("pty-pick");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    for name in [SMOLLM, "qwen2.5-coder-0.5b-instruct-awq-q4_k_m"] {
        let link = models.join(format!("{name}.gguf"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(model_path(name), &link).unwrap();
    }
    let mut p = spawn_chat("pty-pick", &["-t", "2"]);
    p.expect("1. qwen2.5-coder-0.5b-instruct").unwrap();
    p.expect("2. smollm2-135m-instruct").unwrap();
    p.expect("pick a model [1-2, Enter = 1]: ").unwrap();
    say(&mut p, "7", "type a number from 1 to 2");
    say(&mut p, "2", "mica chat: smollm2-135m-instruct");
    p.expect(">>> ").unwrap();
    p.send(ControlCode::EndOfTransmission).unwrap();
    p.expect(Eof).unwrap();
}
