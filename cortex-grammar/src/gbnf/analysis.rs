//! What llama.cpp checks when it loads a lowered grammar, and what loading
//! and running it would cost, each in linear time without recursion:
//!
//! - every rule used is defined, and `root` is;
//! - no rule reaches itself before matching text (left recursion), found
//!   by a depth-first search with an explicit stack;
//! - over the graph of rules entered before any text (a DAG once there is
//!   no left recursion): its longest chain, the rules entered from any one
//!   point (the parse stacks llama.cpp builds to get to text), the steps
//!   its left-recursion check takes, and the ways the grammar can go on at
//!   any one point (the stacks it keeps), each within [`crate::limits`].

use super::{GrammarError, Lowered, Symbol};
use crate::limits::{MAX_LEFT_CHAIN, MAX_LEFT_PATHS, MAX_RULES_ENTERED, MAX_WAYS_AT_ONCE};

pub(super) fn check(grammar: &Lowered) -> Result<(), GrammarError> {
    let rules = &grammar.rules;
    let no_root = || GrammarError {
        line: 1,
        message: "the grammar has no root rule (generation starts at `root ::= ...`)".into(),
    };
    let root = grammar.root.ok_or_else(no_root)?;
    if rules[root].alternatives.is_none() {
        return Err(no_root());
    }
    let alternatives: Vec<&[Vec<Symbol>]> = rules
        .iter()
        .map(|rule| rule.alternatives.as_deref().unwrap_or_default())
        .collect();
    for symbol in alternatives.iter().flat_map(|a| a.iter().flatten()) {
        if let Symbol::Rule { id, line } = *symbol
            && rules[id].alternatives.is_none()
        {
            return Err(GrammarError {
                line,
                message: format!("rule {} is used but not defined", grammar.name(id)),
            });
        }
    }
    let nullable = nullable_rules(&alternatives);
    let edges = leftmost_edges(&alternatives, &nullable);
    let order = topological_order(grammar, &edges)?;
    bound_costs(grammar, &alternatives, &nullable, &edges, &order)
}

/// Which rules can match the empty text: a worklist over the alternatives,
/// each waiting for its references to become nullable (linear).
fn nullable_rules(alternatives: &[&[Vec<Symbol>]]) -> Vec<bool> {
    let mut nullable = vec![false; alternatives.len()];
    // For each alternative, the references not yet known nullable; one
    // with text can never become nullable.
    let mut waiting: Vec<Vec<usize>> = Vec::with_capacity(alternatives.len());
    // Rule → the (rule, alternative) pairs that refer to it, once per use.
    let mut used_in: Vec<Vec<(usize, usize)>> = vec![Vec::new(); alternatives.len()];
    let mut ready: Vec<usize> = Vec::new();
    for (rule, alts) in alternatives.iter().enumerate() {
        let mut counts = Vec::with_capacity(alts.len());
        for (index, alternative) in alts.iter().enumerate() {
            let mut count = 0;
            let mut text = false;
            for symbol in alternative {
                match *symbol {
                    Symbol::Text => text = true,
                    Symbol::Rule { id, .. } => {
                        count += 1;
                        used_in[id].push((rule, index));
                    }
                }
            }
            if text {
                count = usize::MAX;
            } else if count == 0 && !nullable[rule] {
                nullable[rule] = true;
                ready.push(rule);
            }
            counts.push(count);
        }
        waiting.push(counts);
    }
    while let Some(rule) = ready.pop() {
        for &(user, index) in &used_in[rule] {
            let count = &mut waiting[user][index];
            if *count == usize::MAX || *count == 0 {
                continue;
            }
            *count -= 1;
            if *count == 0 && !nullable[user] {
                nullable[user] = true;
                ready.push(user);
            }
        }
    }
    nullable
}

fn symbol_nullable(symbol: Symbol, nullable: &[bool]) -> bool {
    match symbol {
        Symbol::Text => false,
        Symbol::Rule { id, .. } => nullable[id],
    }
}

/// For each rule, the rules it can enter before matching any text (once per
/// use), with the line of the use.
fn leftmost_edges(alternatives: &[&[Vec<Symbol>]], nullable: &[bool]) -> Vec<Vec<(usize, usize)>> {
    alternatives
        .iter()
        .map(|alts| {
            let mut out = Vec::new();
            for alternative in *alts {
                for &symbol in alternative {
                    if let Symbol::Rule { id, line } = symbol {
                        out.push((id, line));
                    }
                    if !symbol_nullable(symbol, nullable) {
                        break;
                    }
                }
            }
            out
        })
        .collect()
}

/// The rules in an order where each comes after every rule it enters
/// before any text; a rule found on the current path is left recursion.
fn topological_order(
    grammar: &Lowered,
    edges: &[Vec<(usize, usize)>],
) -> Result<Vec<usize>, GrammarError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut mark = vec![Mark::New; edges.len()];
    let mut order = Vec::with_capacity(edges.len());
    let mut path: Vec<(usize, usize)> = Vec::new();
    for start in 0..edges.len() {
        if mark[start] != Mark::New {
            continue;
        }
        mark[start] = Mark::OnPath;
        path.push((start, 0));
        while let Some(&mut (rule, ref mut next)) = path.last_mut() {
            let Some(&(target, line)) = edges[rule].get(*next) else {
                mark[rule] = Mark::Done;
                order.push(rule);
                path.pop();
                continue;
            };
            *next += 1;
            match mark[target] {
                Mark::Done => {}
                Mark::New => {
                    mark[target] = Mark::OnPath;
                    path.push((target, 0));
                }
                Mark::OnPath => return Err(left_recursion(grammar, target, line)),
            }
        }
    }
    Ok(order)
}

fn left_recursion(grammar: &Lowered, rule: usize, line: usize) -> GrammarError {
    let name = grammar.name(rule);
    let message = if grammar.rules[rule].unbounded_repetition {
        format!(
            "rule {name} repeats without end (* or +) something that can match no text, which llama.cpp refuses as left recursion"
        )
    } else {
        format!("rule {name} is left-recursive (it can reach itself before matching any text)")
    };
    GrammarError { line, message }
}

/// With `order` a topological order of the rules entered before any text:
/// the longest chain of them, the rules entered from every point, the
/// steps of llama.cpp's left-recursion check and the ways to go on at every
/// point, each against its limit.
fn bound_costs(
    grammar: &Lowered,
    alternatives: &[&[Vec<Symbol>]],
    nullable: &[bool],
    edges: &[Vec<(usize, usize)>],
    order: &[usize],
) -> Result<(), GrammarError> {
    let rules = &grammar.rules;
    let n = edges.len();
    // Chain length, rules entered (itself included) and ways, per rule
    // (children first).
    let mut chain = vec![0usize; n];
    let mut entered = vec![0u64; n];
    let mut ways = vec![0u64; n];
    for &rule in order {
        chain[rule] = 1 + edges[rule]
            .iter()
            .map(|&(t, _)| chain[t])
            .max()
            .unwrap_or(0);
        if chain[rule] > MAX_LEFT_CHAIN {
            return Err(grammar.rule_error(
                rule,
                &format!(
                    "enters a chain of more than {MAX_LEFT_CHAIN} rules before matching any text (limit {MAX_LEFT_CHAIN})"
                ),
            ));
        }
        entered[rule] = edges[rule]
            .iter()
            .fold(1u64, |sum, &(t, _)| sum.saturating_add(entered[t]));
        if entered[rule] > MAX_RULES_ENTERED {
            return Err(too_many_entered(grammar, rule));
        }
        ways[rule] = alternatives[rule]
            .iter()
            .map(|alternative| ways_from(alternative, &ways, nullable))
            .fold(0u64, u64::saturating_add);
    }
    // llama.cpp checks each rule not yet visited, in number order, and its
    // check visits every rule it enters before any text.
    let mut visited = vec![false; n];
    let mut total: u64 = 0;
    let mut stack = Vec::new();
    for start in 0..n {
        if visited[start] {
            continue;
        }
        total = total.saturating_add(entered[start]);
        if total > MAX_LEFT_PATHS {
            return Err(GrammarError {
                line: rules[start].line,
                message: format!(
                    "the rules from {} on branch into more than {MAX_LEFT_PATHS} paths before matching any text (llama.cpp walks every one when it loads the grammar); make fewer rules optional or alternative at the start",
                    grammar.name(start)
                ),
            });
        }
        visited[start] = true;
        stack.push(start);
        while let Some(rule) = stack.pop() {
            for &(target, _) in &edges[rule] {
                if !visited[target] {
                    visited[target] = true;
                    stack.push(target);
                }
            }
        }
    }
    // Every point inside an alternative, not just its start: what it goes
    // on to through the symbols after it that can match nothing.
    for (rule, alts) in alternatives.iter().enumerate() {
        for alternative in *alts {
            let (mut ways_on, mut entered_on) = (0u64, 0u64);
            for &symbol in alternative.iter().rev() {
                let (here_ways, here_entered) = match symbol {
                    Symbol::Text => (1, 0),
                    Symbol::Rule { id, .. } => (ways[id], entered[id]),
                };
                if symbol_nullable(symbol, nullable) {
                    ways_on = here_ways.saturating_add(ways_on);
                    entered_on = here_entered.saturating_add(entered_on);
                } else {
                    (ways_on, entered_on) = (here_ways, here_entered);
                }
                if ways_on > MAX_WAYS_AT_ONCE {
                    return Err(too_many_ways(grammar, rule));
                }
                if entered_on > MAX_RULES_ENTERED {
                    return Err(too_many_entered(grammar, rule));
                }
            }
        }
        if ways[rule] > MAX_WAYS_AT_ONCE {
            return Err(too_many_ways(grammar, rule));
        }
    }
    Ok(())
}

/// The ways an alternative can begin: each symbol until the first that
/// must match text, a rule counting the ways it can begin.
fn ways_from(alternative: &[Symbol], ways: &[u64], nullable: &[bool]) -> u64 {
    let mut total: u64 = 0;
    for &symbol in alternative {
        let here = match symbol {
            Symbol::Text => 1,
            Symbol::Rule { id, .. } => ways[id],
        };
        total = total.saturating_add(here);
        if !symbol_nullable(symbol, nullable) {
            break;
        }
    }
    total
}

fn too_many_entered(grammar: &Lowered, rule: usize) -> GrammarError {
    grammar.rule_error(
        rule,
        &format!(
            "enters more than {MAX_RULES_ENTERED} rules from one point before matching any text (limit {MAX_RULES_ENTERED}; rules that can match nothing and branch multiply them)"
        ),
    )
}

fn too_many_ways(grammar: &Lowered, rule: usize) -> GrammarError {
    grammar.rule_error(
        rule,
        &format!(
            "can go on in more than {MAX_WAYS_AT_ONCE} ways at one point (limit {MAX_WAYS_AT_ONCE}; each is checked against every token); factor out common beginnings of alternatives"
        ),
    )
}
