//! Seed 001's experiment, printed: `cargo run -p hookledger --example seed001`.
//! The same rule the `seats.snapshot` projection enforces in DynamoDB.

use hookledger::seed001::{
    EVENTS, INTENDED, Policy, correct_orders, duplicate_extensions, five_deliveries, permutations, run,
};

fn main() {
    println!("Three events for one object: revision 1 → 10 seats, 2 → 30, 3 → 20. Intended final value: {INTENDED}.\n");
    println!("| Policy | Correct final state across six orders |");
    println!("|---|---|");
    for policy in Policy::ALL {
        println!("| {} | {} of {} |", policy.name(), correct_orders(policy), permutations().len());
    }

    let ext = duplicate_extensions();
    let kept =
        ext.iter().filter(|seq| run(Policy::RevisionGuard, seq).0.last().copied().flatten() == Some(INTENDED)).count();
    println!(
        "\nDuplicate insertions (each event re-inserted at each position of each order): {kept} of {} keep the guarded value.",
        ext.len()
    );

    println!("\nFive deliveries, revisions 3, 1, 2, 2, 1:\n");
    println!(
        "| Delivery | Event revision | Event seat value | Arrival-order state | Event-ID-only state | Revision-guard state |"
    );
    println!("|---|---|---|---|---|---|");
    let d = five_deliveries();
    let traces: Vec<(Vec<Option<i64>>, usize)> = Policy::ALL.iter().map(|p| run(*p, &d)).collect();
    for (i, e) in d.iter().enumerate() {
        let cell = |t: &Vec<Option<i64>>| t[i].map_or("-".to_owned(), |v| v.to_string());
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            i + 1,
            e.revision,
            e.seats,
            cell(&traces[0].0),
            cell(&traces[1].0),
            cell(&traces[2].0)
        );
    }
    println!(
        "\nUpdates performed: arrival order {}, event-ID dedup {}, revision guard {}. Events: {:?}",
        traces[0].1,
        traces[1].1,
        traces[2].1,
        EVENTS.iter().map(|e| e.event_id).collect::<Vec<_>>()
    );
}
