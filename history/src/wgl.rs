//! A linearizability checker: Wing & Gong's search with Lowe's
//! memoization, the algorithm of Knossos's `linear` checker and of
//! porcupine, written here generically over a sequential specification
//! (it knows only the `Spec` it is given).
//!
//! Why not only `consistency_model` (stateright's tester): its search has no
//! memo, so one history of an 8-second run with kills (83 grants) was not
//! decided in a minute. This one remembers every (set of linearized
//! operations, state) it has tried, which makes the same history take
//! milliseconds; the test `agrees_with_stateright_on_small_histories`
//! checks that the two give the same answer on thousands of random small
//! histories.
//!
//! Operations whose outcome is unknown (`output: None`: a process killed
//! mid-call, an `info`) may be linearized anywhere between their call and
//! their `ret` (if they have one: the latest they could have taken effect),
//! or not at all: past that instant the search skips them (a decision it
//! undoes like the others). It succeeds once every completed operation is
//! linearized.

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification: from a state, an operation with its
/// observed output (None: unknown) leads to the next state, or is
/// impossible.
pub trait Spec {
    type State: Clone + Eq + Hash;
    type Input;
    type Output;
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;
}

/// One operation: called at `call`, returned `output` at `ret` (None: never
/// returned), in one clock.
pub struct Operation<I, O> {
    pub input: I,
    pub output: Option<O>,
    pub call: u64,
    pub ret: Option<u64>,
}

#[derive(Clone, Copy)]
struct Entry {
    op: usize,
    is_call: bool,
    prev: usize,
    next: usize,
    /// The other entry of its operation (a call's return, a return's call).
    partner: usize,
}

const HEAD: usize = 0;
const NIL: usize = usize::MAX;

/// Whether `ops` is linearizable with respect to `spec` from `init`; None
/// when the search tried more than `max_states` distinct states.
pub fn linearizable<S: Spec>(
    spec: &S,
    init: S::State,
    ops: &[Operation<S::Input, S::Output>],
    max_states: usize,
) -> Option<bool> {
    // Events by time; at a tie, calls first (the operations overlap).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, true, i));
        events.push((op.ret.unwrap_or(u64::MAX), false, i));
    }
    events.sort_by_key(|&(t, is_call, i)| (t, !is_call, i));
    // A doubly linked list behind a head sentinel (index 0).
    let mut list = vec![Entry {
        op: 0,
        is_call: false,
        prev: NIL,
        next: 1,
        partner: NIL,
    }];
    let mut ret_of = vec![NIL; ops.len()];
    let mut call_of = vec![NIL; ops.len()];
    for (k, &(_, is_call, op)) in events.iter().enumerate() {
        let idx = k + 1;
        list.push(Entry {
            op,
            is_call,
            prev: idx - 1,
            next: if k + 1 < events.len() { idx + 1 } else { NIL },
            partner: NIL,
        });
        if is_call {
            call_of[op] = idx;
        } else {
            ret_of[op] = idx;
        }
    }
    if events.is_empty() {
        list[HEAD].next = NIL;
    }
    for op in 0..ops.len() {
        list[call_of[op]].partner = ret_of[op];
        list[ret_of[op]].partner = call_of[op];
    }
    let completed = ops.iter().filter(|o| o.output.is_some()).count();
    let words = ops.len().div_ceil(64);
    let mut done = vec![0u64; words];
    let mut done_completed = 0;
    let mut state = init;
    let mut cache: HashSet<(Vec<u64>, S::State)> = HashSet::new();
    // Decisions: (the call's entry, the state before, whether the operation
    // was skipped: an unknown one that did not take effect).
    let mut stack: Vec<(usize, S::State, bool)> = Vec::new();
    let mut entry = list[HEAD].next;
    let lift = |list: &mut Vec<Entry>, call: usize| {
        for i in [call, list[call].partner] {
            let (p, n) = (list[i].prev, list[i].next);
            list[p].next = n;
            if n != NIL {
                list[n].prev = p;
            }
        }
    };
    let unlift = |list: &mut Vec<Entry>, call: usize| {
        for i in [list[call].partner, call] {
            let (p, n) = (list[i].prev, list[i].next);
            list[p].next = i;
            if n != NIL {
                list[n].prev = i;
            }
        }
    };
    loop {
        if done_completed == completed {
            return Some(true);
        }
        if entry != NIL && !list[entry].is_call && ops[list[entry].op].output.is_none() {
            // The return of an unknown operation not linearized before it:
            // it did not take effect (skipped; undone if that fails).
            let call = list[entry].partner;
            let op = list[call].op;
            let mut with = done.clone();
            with[op / 64] |= 1 << (op % 64);
            if cache.insert((with.clone(), state.clone())) {
                if cache.len() > max_states {
                    return None;
                }
                stack.push((call, state.clone(), true));
                done = with;
                lift(&mut list, call);
                entry = list[HEAD].next;
                continue;
            }
        } else if entry != NIL && list[entry].is_call {
            // A call: linearize it here if the specification allows and
            // this (set, state) was never tried; else try the next entry.
            let e = list[entry];
            let op = &ops[e.op];
            if let Some(next) = spec.step(&state, &op.input, op.output.as_ref()) {
                let mut with = done.clone();
                with[e.op / 64] |= 1 << (e.op % 64);
                if cache.insert((with.clone(), next.clone())) {
                    if cache.len() > max_states {
                        return None;
                    }
                    stack.push((entry, std::mem::replace(&mut state, next), false));
                    done = with;
                    if op.output.is_some() {
                        done_completed += 1;
                    }
                    lift(&mut list, entry);
                    entry = list[HEAD].next;
                    continue;
                }
            }
            entry = e.next;
            continue;
        }
        // Past the end, at the first return of a completed operation not
        // yet linearized (its call had to go before it, and no order tried
        // so far allowed that), or at a skip already tried: backtrack. A
        // skip undone was the only choice left where it was made, so the
        // decision before it is undone too.
        loop {
            let Some((call, previous, skipped)) = stack.pop() else {
                return Some(false);
            };
            let op = list[call].op;
            done[op / 64] &= !(1 << (op % 64));
            if ops[op].output.is_some() {
                done_completed -= 1;
            }
            state = previous;
            unlift(&mut list, call);
            if !skipped {
                entry = list[call].next;
                break;
            }
        }
    }
}
