//! A `rustle serve` for the tests that talk to it over HTTP (tests/server.rs, and the
//! browser's tests/browser/): the real binary on a free loopback port, the default model on
//! the CPU.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The default model's served name (its file name without `.gguf`).
pub const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

/// A running `rustle serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// Everything it printed on stderr, for failure messages.
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `rustle serve --device cpu --port 0 ARGS` and waits for its address.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        // Fetched once into the cache when missing, so the server's own start is quick.
        rustle::loader::resolve_model_path(None).expect("the default model");
        let bin =
            std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--device", "cpu", "--port", "0"])
            .args(args)
            .env_remove("RUSTLE_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start rustle serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        // Drains stderr for the server's whole life, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.split("listening on ").nth(1) {
                    let _ = tx.send(at.trim().to_string());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| {
                panic!(
                    "rustle serve did not start:\n{}",
                    log.lock().unwrap().as_str()
                )
            });
        Server { child, base, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
