//! Each command's setting flags, made from the table: a scope per kind of
//! command names the groups of settings it takes.

use std::marker::PhantomData;

use super::{DEFS, Def, Group, RawValues};

/// Which groups of settings a command takes: a marker type per kind of
/// command, so that each command's flags come from the table.
pub(crate) trait Scope {
    const GROUPS: &'static [Group];
    /// Whether the flags show in the command's help (the top level accepts
    /// every setting, and shows only the common ones).
    const SHOWN: fn(&Def) -> bool = |_| true;
}

macro_rules! scopes {
    ($($(#[doc = $doc:literal])+ $scope:ident: [$($group:ident),*];)*) => {
        $(
            $(#[doc = $doc])+
            #[derive(Debug, Clone, Copy)]
            pub(crate) struct $scope;
            impl Scope for $scope {
                const GROUPS: &'static [Group] = &[$(Group::$group),*];
            }
        )*
    };
}

scopes! {
    /// Commands that read or write jobs only.
    ForQueue: [Queue];
    /// `cortex submit`.
    ForSubmit: [Queue, Model, Submit];
    /// `cortex worker`.
    ForWorker: [Queue, Model, Engine, Work];
    /// `cortex run`.
    ForRun: [Queue, Model, Engine, Work, Submit];
    /// Commands that run the model without a queue: `generate`, `bench`.
    ForEngine: [Model, Engine];
    /// `cortex models`: the registry, and the jobs that need a model.
    ForModels: [Queue, Model];
    /// `cortex list`: jobs, only one model's when a model is given.
    ForList: [Queue, Model];
    /// `cortex devices`.
    ForDevices: [Engine];
    /// `cortex serve`.
    ForServe: [Queue, Model, Engine, Work, Server];
    /// `cortex config`: every setting.
    ForConfig: [Queue, Model, Engine, Work, Submit, Server];
}

/// Before the command's name (`cortex --model X submit ...`): every setting
/// is taken (and checked against the command), the queue's and the model's
/// shown.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BeforeCommand;

impl Scope for BeforeCommand {
    const GROUPS: &'static [Group] = ForConfig::GROUPS;
    const SHOWN: fn(&Def) -> bool = |def| matches!(def.group, Group::Queue | Group::Model);
}

/// The setting flags a command was given, by setting name.
#[derive(Debug, Clone)]
pub(crate) struct SettingFlags<S> {
    pub(crate) values: RawValues,
    scope: PhantomData<S>,
}

impl<S> Default for SettingFlags<S> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            scope: PhantomData,
        }
    }
}

impl<S: Scope> SettingFlags<S> {
    fn defs() -> impl Iterator<Item = &'static Def> {
        DEFS.iter().filter(|d| S::GROUPS.contains(&d.group))
    }
}

impl<S: Scope> clap::FromArgMatches for SettingFlags<S> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for def in Self::defs() {
            if let Ok(Some(values)) = matches.try_get_many::<String>(def.name) {
                let raw: Vec<&str> = values.map(String::as_str).collect();
                self.values.push((def.name, raw.join(",")));
            }
        }
        Ok(())
    }
}

impl<S: Scope> clap::Args for SettingFlags<S> {
    fn augment_args(command: clap::Command) -> clap::Command {
        Self::defs().fold(command, |command, def| {
            command.arg(def.arg().hide(!(S::SHOWN)(def)).help_heading("Settings"))
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}
