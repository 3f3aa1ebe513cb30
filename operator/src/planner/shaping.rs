//! The topology: built from the join reports once enough members joined (the graph and its
//! options are core's [`Recipe`] for the job), repaired member by member afterwards (members
//! traded between cliques where a burst of losses left them skewed), and members relocated to
//! their clique's zone.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use murmur_core::api::{DecentralizedTrainingJobSpec, JobPhase};
use murmur_core::contract::JoinReport;
use murmur_core::topology::{self, MemberId, MemberProfile, Recipe, Topology};

use super::{
    Action, EventKind, JOIN_GRACE_SECONDS, JobState, Observation, Reason, event, seconds_since,
};
use crate::member::{Lifecycle, MemberRecord};

/// Build the topology once enough members joined; afterwards repair it member by member, and
/// trade members between its cliques when the repairs left them skewed.
pub(super) fn shape_topology(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    // Members with a live current attempt that has sent its join report, and is not being
    // stopped: a mover's pod runs on until its deletion is written, and must not rejoin
    // meanwhile (it would join a clique of the zone it is leaving, and its next attempt would
    // ask for that zone).
    let joined: Vec<&JoinReport> = observed
        .recorded(&s.members)
        .filter(|c| c.record.is_some_and(|r| r.lifecycle.is_active()))
        .filter_map(|c| c.live?.join.as_deref())
        .collect();
    let zone = |id: MemberId| observed.members.get(&id).and_then(|m| m.zone.clone());
    let before = s.topology.as_ref().map(|t| t.version);
    match &mut s.topology {
        None => {
            let everyone = joined.len() >= spec.replicas.target as usize;
            let enough = joined.len() >= spec.replicas.min as usize
                && seconds_since(s.created_at, now) >= JOIN_GRACE_SECONDS;
            if !(everyone || enough) {
                return;
            }
            let profiles: Vec<MemberProfile> = joined
                .iter()
                .map(|j| MemberProfile::from_join(j, zone(j.member_id)))
                .collect();
            match Recipe::for_job(spec).build(&profiles) {
                Ok(mut t) => {
                    t.version = s.last_version + 1;
                    relocate(&mut t, &mut s.members, &mut s.relocations, actions);
                    s.topology = Some(Arc::new(t));
                }
                Err(e) => {
                    s.phase = JobPhase::Failed;
                    s.completed_at = Some(now);
                    s.message = Some(format!("cannot build the topology: {e}"));
                    actions.push(event(
                        EventKind::Warning,
                        Reason::Failed,
                        None,
                        s.message.clone().unwrap_or_default(),
                    ));
                    return;
                }
            }
        }
        Some(t) => {
            let gone: Vec<(MemberId, u32)> = observed
                .current(t.graph.members(), &s.members)
                .filter(|c| c.live.is_none() || c.record.is_some_and(|r| r.lifecycle.is_retired()))
                .map(|c| (c.id, c.attempt()))
                .collect();
            // A plan that changes nothing shares the topology it had.
            let joining = joined
                .iter()
                .any(|r| !t.profiles.contains_key(&r.member_id));
            if gone.is_empty() && !joining {
                return;
            }
            let t = Arc::make_mut(t);
            // One repair for this plan's leaves and joins: the graph is rebuilt once, not after
            // each member (a thousand joins at 10 000 members took seconds).
            let mut repair = t.repair();
            for (id, attempt) in gone {
                if repair.member_count() == 1 {
                    // The last one: nothing to repair. Rebuilt when members rejoin.
                    drop(repair);
                    s.last_version = t.version;
                    s.topology = None;
                    actions.push(event(
                        EventKind::Warning,
                        Reason::AllMembersLost,
                        None,
                        "every member is gone; the job resumes from checkpoints".into(),
                    ));
                    return;
                }
                if let Some(record) = s.members.get_mut(&id) {
                    record.clique = repair.clique_of(id);
                    record.zone = record.clique.and_then(|c| repair.zone_of_clique(c));
                }
                repair.remove_member(id).expect("listed from the graph");
                actions.push(event(
                    EventKind::Normal,
                    Reason::Left,
                    Some((id, attempt)),
                    format!("member {id} left the topology; its neighbours were rewired"),
                ));
            }
            for report in joined {
                if !repair.contains(report.member_id) {
                    // A moved member joins the clique it was moved for, while it has room:
                    // moved members rejoining in another order took each other's cliques,
                    // splitting a clique over zones and skewing two cliques' labels. One the
                    // scheduler placed outside that clique's zone anyway joins as anyone does,
                    // in a clique of its own zone.
                    let landed = zone(report.member_id);
                    let home = s
                        .members
                        .get(&report.member_id)
                        .filter(|r| r.relocated)
                        .filter(|r| r.zone.is_none() || landed.is_none() || r.zone == landed)
                        .and_then(|r| r.clique);
                    // A profile of the right length was checked when the report came in.
                    let _ = repair.rejoin(
                        MemberProfile::from_join(report, zone(report.member_id)),
                        home,
                    );
                }
            }
            drop(repair);
            // Not while a member moved to its clique's zone is away: it comes back to a place its
            // clique keeps for it, which a trade could fill. Trades keep to zones, so a job over
            // several zones is rebalanced too: a node lost with three of a clique's five left a
            // clique of seven (the remnant dissolved into the other) and one of three (the
            // replacements), missing four classes, until the job's end.
            let awaited = s
                .members
                .iter()
                .any(|(id, r)| r.relocated && !r.given_up && !t.profiles.contains_key(id));
            if before != Some(t.version)
                && !awaited
                && let Some(done) = Recipe::for_job(spec).rebalance(&mut *t)
            {
                let moved: std::collections::BTreeSet<MemberId> = done
                    .trades
                    .iter()
                    .flat_map(topology::dcliques::Trade::members)
                    .collect();
                actions.push(event(
                    EventKind::Normal,
                    Reason::CliquesRebalanced,
                    None,
                    format!(
                        "{} members traded between cliques ({moved:?}): repair had left the worst clique's label skew at {:.2}, now {:.2}",
                        moved.len(),
                        done.before,
                        done.after
                    ),
                ));
            }
        }
    }
    if let Some(t) = &s.topology
        && before != Some(t.version)
    {
        s.last_version = t.version;
        actions.push(event(
            EventKind::Normal,
            Reason::TopologyChanged,
            None,
            format!(
                "topology version {}: {} members, {} edges",
                t.version,
                t.graph.member_count(),
                t.graph.edge_count()
            ),
        ));
    }
}

/// Zone-aware cliques cross zones where one zone's members cannot balance the labels. Before
/// anyone trains, the members outside their clique's zone leave the topology and stop; their next
/// attempt asks for the clique's zone and, once joined, refills the clique. Once per member.
fn relocate(
    t: &mut Topology,
    members: &mut BTreeMap<MemberId, MemberRecord>,
    relocations: &mut u32,
    actions: &mut Vec<Action>,
) {
    let misplaced = topology::zones::misplaced(t);
    let from: Vec<String> = misplaced
        .iter()
        .map(|m| t.profiles[&m.member].zone.clone().unwrap_or_default())
        .collect();
    let mut repair = t.repair();
    for (m, from) in misplaced.into_iter().zip(from) {
        let Some(record) = members.get_mut(&m.member) else {
            continue;
        };
        if record.relocated || !record.lifecycle.is_active() || repair.member_count() <= 1 {
            continue;
        }
        // Set aside, not removed: a clique left with two of five would be spread over the
        // others, across zones, and the movers would come back to a clique that is gone.
        repair
            .set_aside(m.member)
            .expect("listed from the topology");
        record.become_(Lifecycle::Retiring);
        record.relocated = true;
        record.clique = Some(m.clique);
        record.zone = Some(m.zone.clone());
        *relocations += 1;
        actions.push(Action::Stop {
            member: m.member,
            attempt: record.attempt,
        });
        actions.push(event(
            EventKind::Normal,
            Reason::Relocated,
            Some((m.member, record.attempt)),
            format!(
                "member {} moves from {from} to {}, where clique {} trains",
                m.member, m.zone, m.clique
            ),
        ));
    }
}
