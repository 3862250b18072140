//! Log lines produced by the rules, kept for the caller as well as logged.

/// Severity of a [`Message`], numbered like Python's `logging` levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// `logging.INFO` (20).
    Info = 20,
    /// `logging.WARNING` (30).
    Warning = 30,
}

impl Level {
    /// The numeric level (20 or 30).
    pub fn as_i32(self) -> i32 {
        self as i32
    }
}

/// One info or warning line, text copied from SGLang where SGLang logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Severity.
    pub level: Level,
    /// The exact text.
    pub text: String,
}

impl Message {
    /// An INFO line.
    pub fn info(text: impl Into<String>) -> Self {
        Message { level: Level::Info, text: text.into() }
    }

    /// A WARNING line.
    pub fn warning(text: impl Into<String>) -> Self {
        Message { level: Level::Warning, text: text.into() }
    }

    /// Send the line to the `log` crate at its level.
    pub fn log(&self) {
        match self.level {
            Level::Info => log::info!(target: "pdx::config", "{}", self.text),
            Level::Warning => log::warn!(target: "pdx::config", "{}", self.text),
        }
    }
}
