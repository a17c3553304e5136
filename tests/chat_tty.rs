//! `rustle chat` in a terminal, as a person meets it: a pseudo-terminal whose keystrokes the
//! test types. Unlike a pipe (tests/cli.rs), this is where the line editor runs, and where
//! Ctrl-C is the terminal's: a key the editor reads at the prompt, a SIGINT to the program
//! while a reply streams.
//!
//! Assertions are on what the program guarantees (each turn's "[USED of CONTEXT tokens"
//! line, its stop reason, the exit status), never on what the model says. Every wait has a
//! deadline, so a hang fails the test instead of blocking it.

#![cfg(unix)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::libc;
use nix::pty::{Winsize, openpty};

/// The longest any one step may take (loading the model, one reply) on a busy CPU.
const STEP: Duration = Duration::from_secs(180);

/// Ctrl-C as the keyboard sends it.
const CTRL_C: &[u8] = b"\x03";

/// `rustle chat ARGS` on a terminal of its own, and everything it has written there.
struct Terminal {
    child: Child,
    /// The terminal's master side: what is written here is typed.
    keys: File,
    /// What the program writes, read by a thread (a blocking read has no deadline); the
    /// channel closes when the program has closed the terminal.
    output: Receiver<Vec<u8>>,
    seen: Vec<u8>,
    /// How much of `seen` earlier waits consumed.
    read_to: usize,
}

impl Terminal {
    fn open(args: &[&str]) -> Terminal {
        let bin =
            std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
        // Wide enough that no typed line wraps.
        let size = Winsize {
            ws_row: 50,
            ws_col: 250,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&size), None).expect("openpty");
        let mut command = Command::new(bin);
        command
            .arg("chat")
            .args(args)
            // The line editor falls back to plain reads on a "dumb" terminal (as CI's TERM
            // may be); a terminal emulator's TERM gives the editor a person would have.
            .env("TERM", "xterm")
            .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
            .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(Stdio::from(pty.slave));
        // SAFETY: between fork and exec, only async-signal-safe calls. A session of its own
        // with the terminal as its controlling terminal is what makes the kernel turn a typed
        // Ctrl-C into SIGINT for the program, as a shell does.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("start rustle chat");
        // The parent's copies of the terminal's slave side go with `command`, so that the
        // reads below end when the program has gone.
        drop(command);
        let keys = File::from(pty.master);
        let mut screen = keys.try_clone().unwrap();
        let (send, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Linux answers EIO once no one holds the slave side: that is the end.
            while let Ok(n @ 1..) = screen.read(&mut buf) {
                if send.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            child,
            keys,
            output,
            seen: vec![],
            read_to: 0,
        }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        self.keys.write_all(keys).unwrap();
        self.keys.flush().unwrap();
    }

    /// Types `line` and Enter (a carriage return, as a terminal in raw mode reads it).
    fn type_line(&mut self, line: &str) {
        self.type_keys(format!("{line}\r").as_bytes());
    }

    /// Waits until the output not yet consumed holds what `find` looks for (it returns where
    /// that ends), and consumes the output up to there.
    fn wait(&mut self, what: &str, find: impl Fn(&[u8]) -> Option<usize>) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(end) = find(&self.seen[self.read_to..]) {
                let text = &self.seen[self.read_to..self.read_to + end];
                self.read_to += end;
                return String::from_utf8_lossy(text).into_owned();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(bytes) => self.seen.extend(bytes),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {what} within {STEP:?}:\n{}", self.transcript())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the program closed the terminal before {what} ({}):\n{}",
                        self.status_soon(),
                        self.transcript()
                    )
                }
            }
        }
    }

    /// Waits for `needle` and consumes the output through it.
    fn expect(&mut self, needle: &str) -> String {
        let n = needle.as_bytes();
        self.wait(&format!("{needle:?}"), |s| {
            s.windows(n.len()).position(|w| w == n).map(|i| i + n.len())
        })
    }

    /// Waits for the status line that ends a reply, "[USED of CONTEXT tokens, R tok/s, WHY]",
    /// and the next prompt; returns the reply and its status.
    fn reply(&mut self) -> Turn {
        let before = self.expect(" tok/s");
        let why = self.expect("]");
        self.expect("> ");
        let at = before.rfind('[').expect("the status line's [");
        let numbers: Vec<usize> = before[at + 1..]
            .split(' ')
            .filter_map(|w| w.parse().ok())
            .collect();
        let [used, context] = numbers[..] else {
            panic!("a status line without its counts: {:?}", &before[at..]);
        };
        Turn {
            text: before[..at].to_owned(),
            used,
            context,
            why: why.trim_end_matches(']').to_owned(),
        }
    }

    /// Types a user message and waits for the whole reply.
    fn turn(&mut self, line: &str) -> Turn {
        self.type_line(line);
        let turn = self.reply();
        eprintln!(
            "> {line}\n{}[{} of {} tokens{}]",
            turn.text.trim(),
            turn.used,
            turn.context,
            turn.why
        );
        turn
    }

    /// Waits for the program to end by itself and gives its exit status.
    fn exit_status(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running {STEP:?} after being told to leave:\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status of a program that has closed its terminal, as a shell would show it
    /// (`signal: 2 (SIGINT)` for one that Ctrl-C ended).
    fn status_soon(&mut self) -> String {
        for _ in 0..40 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.to_string();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        "still running".into()
    }

    fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }
}

impl Drop for Terminal {
    /// A failed test leaves no program behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

struct Turn {
    /// What the program wrote for this turn before its status line: the echoed line and the
    /// reply.
    text: String,
    used: usize,
    context: usize,
    /// The stop reason after the speed, e.g. ", stopped"; empty when the model ended it.
    why: String,
}

/// Three turns that each carry the ones before, /reset and /system starting again, Ctrl-C
/// stopping a long reply and then clearing the prompt without ending the program, /exit
/// ending it with status 0; on the default model, on the CPU.
#[test]
fn chat_in_a_terminal() {
    // 48 tokens keep each reply short; the story asked for below runs to all 48 unless
    // Ctrl-C stops it.
    let mut term = Terminal::open(&["--device", "cpu", "-n", "48"]);
    term.expect("a context of");
    term.expect("> ");

    // A long first message (about 60 tokens), so that the conversation that holds it
    // outweighs any one later turn on its own.
    let words = "apple, river, stone, candle, violin, harbour, meadow, lantern, pepper, glacier, \
                 orchard, compass, thimble, falcon, saddle, marble, walnut, chimney, ribbon, anchor";
    let first = term.turn(&format!(
        "Remember these words: {words}. Then tell me: what is the capital of France?"
    ));
    let second = term.turn("And the capital of Italy?");
    let third = term.turn("Which was the first word I asked you to remember?");
    // Each turn's prompt is the whole conversation so far and the new message, so what the
    // context holds grows turn by turn.
    assert!(
        first.used < second.used && second.used < third.used,
        "the context did not grow: {} then {} then {}",
        first.used,
        second.used,
        third.used
    );
    assert!(second.used > first.used + 5 && third.used > second.used + 5);
    assert_eq!(first.context, third.context);

    term.type_line("/reset");
    term.expect("the conversation starts again");
    term.expect("> ");
    let short = "Which was the first word I asked you to remember?";
    let after_reset = term.turn(short);
    assert!(
        after_reset.used < third.used,
        "/reset kept the conversation: {} tokens after it, {} before",
        after_reset.used,
        third.used
    );

    // A system prompt of about 150 tokens: the same message after it weighs more than the
    // whole reply after /reset could (48 tokens).
    let system = format!(
        "You are a patient teacher of geography. {}",
        "Answer in one short sentence, name the country and its capital, and never apologise. "
            .repeat(8)
    );
    term.type_line(&format!("/system {system}"));
    term.expect("a new system prompt; the conversation starts again");
    term.expect("> ");
    let with_system = term.turn(short);
    assert!(
        with_system.used > after_reset.used + 48,
        "the system prompt is not in the context: {} tokens with it, {} without",
        with_system.used,
        after_reset.used
    );

    // Ctrl-C as soon as the reply has begun: the reply stops there, short of its 48 tokens,
    // and the program goes on to the next prompt.
    term.type_line("Write a long story about a dragon who lives in a castle.");
    term.expect("\n"); // the line editor's end of the typed line
    term.wait("the reply's first letters", |s| {
        s.iter()
            .enumerate()
            .filter(|(_, b)| b.is_ascii_alphabetic())
            .nth(10)
            .map(|(i, _)| i + 1)
    });
    term.type_keys(CTRL_C);
    let stopped = term.reply();
    // ", stopped" is a reply the program cut short, not one the model ended or --max-tokens
    // cut.
    assert_eq!(stopped.why, ", stopped", "{}", term.transcript());
    assert!(
        term.child.try_wait().unwrap().is_none(),
        "Ctrl-C ended the program"
    );
    let after_stop = term.turn("Thank you.");
    assert!(
        after_stop.used > stopped.used,
        "the stopped reply's turn left the context: {} then {}",
        stopped.used,
        after_stop.used
    );

    // At the prompt Ctrl-C is the line editor's: it clears the line, the program stays.
    term.type_keys(b"half a line");
    term.type_keys(CTRL_C);
    // The editor ends the cleared line, and the next prompt comes (typed "half a line" has
    // no line end, and its redraws may repeat the old prompt).
    term.expect("\n");
    term.expect("> ");
    term.type_line("/help");
    term.expect("/reset starts the conversation again");
    term.expect("> ");

    term.type_line("/exit");
    let status = term.exit_status();
    assert!(status.success(), "/exit: {status:?}\n{}", term.transcript());
    let transcript = term.transcript();
    assert!(!transcript.contains("panicked"), "{transcript}");
}

/// Ctrl-D at an empty prompt leaves, as /exit does.
#[test]
fn chat_leaves_on_ctrl_d() {
    let mut term = Terminal::open(&["--device", "cpu", "-n", "8"]);
    term.expect("a context of");
    term.expect("> ");
    term.type_keys(b"\x04");
    let status = term.exit_status();
    assert!(
        status.success(),
        "Ctrl-D: {status:?}\n{}",
        term.transcript()
    );
}
