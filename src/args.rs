//! What the command lines share: the input argument, the pass options (one
//! flag per entry of `equarx::options::OPTIONS`) and the parser of named
//! values ([`equarx::choice::Choice`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use equarx::choice::Choice;
use equarx::io::{self, Format, Loaded};
use equarx::options::{OPTIONS, Syntax};

use anyhow::{Context, Result};

#[derive(Args)]
pub struct InputArgs {
    /// The module to read (`-` for stdin; for `rewrite`, also a dump
    /// directory, rewritten module by module into the `-o` directory).
    pub input: PathBuf,
    /// The input's container, if detection should not decide.
    #[arg(long, value_parser = choice::<Format>())]
    pub input_format: Option<Format>,
}

impl InputArgs {
    /// Reads and decodes the input.
    pub fn load(&self) -> Result<Loaded> {
        let name = self.input.display().to_string();
        let bytes = io::read_path(&self.input).with_context(|| format!("cannot read {name}"))?;
        io::decode(&bytes, self.input_format).with_context(|| name)
    }
}

/// A clap parser for the names of a [`Choice`], each with its help.
pub fn choice<T: Choice + Send + Sync>() -> impl TypedValueParser<Value = T> {
    let values = T::ALL
        .iter()
        .map(|v| PossibleValue::new(v.name()).help(v.help()));
    PossibleValuesParser::new(values).try_map(|s| T::parse(&s))
}

/// The pass options: one flag per entry of `equarx::options::OPTIONS`
/// (names, help and defaults come from there); only the given ones are
/// kept, the rest keep the library's defaults.
pub struct PassArgs {
    given: Vec<(&'static str, String)>,
}

impl PassArgs {
    pub fn given(&self, name: &str) -> bool {
        self.given.iter().any(|(n, _)| *n == name)
    }

    /// The options, read by the library's one schema.
    pub fn options(&self) -> Result<equarx::RewriteOptions> {
        equarx::options::from_pairs(self.given.iter().map(|(n, v)| (*n, v.as_str())))
            .map_err(anyhow::Error::msg)
    }
}

impl clap::FromArgMatches for PassArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(PassArgs { given: given_in(m) })
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for PassArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.args(pass_flags())
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// The flags of every option.
fn pass_flags() -> Vec<clap::Arg> {
    OPTIONS
        .iter()
        .map(|o| {
            let mut help = format!("{} [default: {}]", o.help, o.default_text());
            if let Syntax::Choice(names) = o.syntax {
                let _ = write!(help, " [possible values: {}]", names().join(", "));
            }
            let mut arg = clap::Arg::new(o.name)
                .long(o.flag())
                .value_name(o.syntax.placeholder())
                .help(help)
                .help_heading("Pass options");
            for a in o.aliases {
                arg = arg.visible_alias(a.replace('_', "-"));
            }
            match o.syntax {
                Syntax::Bool => arg
                    .num_args(0..=1)
                    .default_missing_value("true")
                    .action(clap::ArgAction::Set),
                Syntax::List(_) => arg.action(clap::ArgAction::Append),
                _ => arg.action(clap::ArgAction::Set),
            }
        })
        .collect()
}

/// The options given on a command line built with [`pass_flags`]: their
/// names and texts, in table order (a repeated list flag joins with `,`).
fn given_in(m: &clap::ArgMatches) -> Vec<(&'static str, String)> {
    OPTIONS
        .iter()
        .filter_map(|o| {
            let values: Vec<String> = m.get_many::<String>(o.name)?.cloned().collect();
            Some((o.name, values.join(",")))
        })
        .collect()
}
