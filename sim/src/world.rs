//! One seed of the simulated deployment: the intake, the work queue, the
//! processor, the reconciler, the routes' dispatcher and the operator's
//! commands, each the library's own use case, over the memory world
//! (`hookledger::adapters::memory`) on a virtual clock and one seeded
//! entropy. Nothing here reads the real clock or real randomness, and
//! nothing waits: a step runs to its end at once, so one seed is one
//! sequence of steps, the same on every run.
//!
//! The scheduler (a SplitMix64 stream from the seed) picks each step among
//! those enabled: a provider delivery that is due, a processor invocation
//! on the visible messages, a reconciler run on its schedule, an operator
//! action, or time passing. Interleavings come from a hook the world runs
//! before every port call: there, now and then, a second worker takes the
//! same record over after its lease expired, another copy of an event
//! arrives, or a reconciler runs, before the first invocation's call goes
//! on. Faults at every port call (throttled, unavailable, acknowledgement
//! lost once or always, a crash before or after the write) are drawn by the
//! world from the entropy during the storm; a crashed invocation is gone
//! (its messages come back after their visibility timeout, its provider
//! retries).

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use hookledger::adapters::memory::{self, MemLedger, MemOutbox, MemPublisher, MemQueue, World};
use hookledger::backfill::{Backfill, Mode, Target};
use hookledger::clock::{Ambient, Clock, ManualClock, SeededEntropy};
use hookledger::config::{self, ProcessorSettings, ReconcilerSettings, SecretResolver, Settings};
use hookledger::identity::EventKey;
use hookledger::intake::{Intake, IntakeRequest};
use hookledger::item::{Item, get_s, n};
use hookledger::ops::Ops;
use hookledger::outbox::Dispatcher;
use hookledger::processor::Processor;
use hookledger::projection::{
    Decision, EventContext, OnConflict, Op, PlanFuture, Projection, ProjectionContext, Write,
};
use hookledger::reconciler::Reconciler;
use hookledger::secret::Secret;
use hookledger::verify::{quiltt, standard, stripe};
use hookledger_app::{account_ledger, entitlement, inventory, seats};
use http::{HeaderMap, HeaderValue, Method};
use serde_json::json;
use sha2::Sha256;

use crate::check::{self, Expected, Fact, Observed, Sent, Violation, Watch};

type Outbox = Dispatcher<MemOutbox, MemPublisher>;
type Proc = Processor<MemLedger, MemQueue, Outbox>;
type Recon = Reconciler<MemQueue, MemLedger, Outbox>;

/// The virtual epoch of every seed.
const START_MS: i64 = 1_800_000_000_000;
/// First deliveries are spread over this window.
const SPREAD_MS: i64 = 10 * 60_000;
/// Faults are injected for this long from the start.
const STORM_MS: i64 = 30 * 60_000;
/// After the storm, everything is terminal within this bound (liveness).
const LIVENESS_MS: i64 = 4 * 3_600_000;
const RECONCILE_EVERY_MS: i64 = 5 * 60_000;
/// Providers retry a delivery not answered 2xx on this schedule (then every 2 h).
const RETRIES_MS: [i64; 6] = [10_000, 60_000, 300_000, 1_800_000, 3_600_000, 7_200_000];
const MAX_STEPS: usize = 20_000;
const SHARDS: u32 = 4;
const TENANT: &str = "t1";
const STRIPE_SECRET: &str = "whsec_sim_stripe";
const SVIX_SECRET: &str = "whsec_c2ltLXN2aXgta2V5LWZvci10aGUtc2ltdWxhdG9y";
const HMAC_SECRET: &str = "sim-hmac";
const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:sim-orders";
const BUS_ARN: &str = "arn:aws:events:us-east-1:123456789012:event-bus/sim";
/// The provider's truth for the one subscription.
const SUBSCRIPTION_SEATS: i64 = 12;
const PARTNER: &str = "partner";
/// The delivery queue's visibility timeout (the template's).
const DELIVERY_VISIBILITY_MS: i64 = 120_000;
const NOTIFY_ARN: &str = "arn:aws:sns:us-east-1:123456789012:sim-notify";
/// Backfill runs of the Stripe endpoint (from the start), and one after the storm.
const BACKFILL_AT_MS: [i64; 2] = [12 * 60_000, 25 * 60_000];

const ENDPOINTS: &str = r#"{
    "stripe": {"provider": "stripe", "tenant": "t1", "secrets": ["env:STRIPE"]},
    "svix": {"provider": "standard_webhooks", "tenant": "t1", "secrets": ["env:SVIX"]},
    "acme": {"provider": "hmac", "tenant": "t1", "secrets": ["env:HMAC"],
             "hmac": {"signature_header": "x-sig", "prefix": "sha256=", "encoding": "hex",
                      "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/type"}}},
    "dropbox": {"provider": "dropbox", "tenant": "t1", "secrets": ["env:HMAC"]},
    "quiltt": {"provider": "quiltt", "tenant": "t1", "secrets": ["env:HMAC"]}
}"#;

/// How hard a seed is pushed (the defaults: `scripts/simulate`).
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// Random faults per thousand port calls during the storm.
    pub faults_per_mille: u32,
    /// Random crashes per thousand port calls during the storm.
    pub crashes_per_mille: u32,
    /// Interleavings per thousand port calls (another invocation runs there).
    pub preempt_per_mille: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Self { faults_per_mille: 40, crashes_per_mille: 8, preempt_per_mille: 25 }
    }
}

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x005e_ed0f_5151)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    pub fn per_mille(&mut self, p: u64) -> bool {
        self.below(1000) < p
    }
}

/// One delivery's content a provider will send (and resend until answered 2xx).
#[derive(Debug, Clone)]
struct Event {
    endpoint: &'static str,
    /// Its id (a batch: its first element's; the trace's name for it).
    event_id: String,
    /// The records it makes: stored key and fact (a batch: one per element;
    /// a notification: none known before, keyed by its body and generation).
    facts: Vec<(String, Fact)>,
    body: Vec<u8>,
}

/// A delivery due at a time.
#[derive(Debug, Clone)]
struct Delivery {
    event: usize,
    /// Attempts made before this one (the retry schedule's position).
    attempt: usize,
}

/// The figures of a run of seeds (summed).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Figures {
    pub seeds: u64,
    pub events: u64,
    pub deliveries: u64,
    pub invocations: u64,
    pub reconciler_runs: u64,
    pub interleavings: u64,
    pub faults: u64,
    pub crashes: u64,
    pub routed_deliveries: u64,
    pub steps: u64,
    /// Virtual milliseconds simulated.
    pub virtual_ms: i64,
}

impl Figures {
    pub fn add(&mut self, o: &Figures) {
        self.seeds += o.seeds;
        self.events += o.events;
        self.deliveries += o.deliveries;
        self.invocations += o.invocations;
        self.reconciler_runs += o.reconciler_runs;
        self.interleavings += o.interleavings;
        self.faults += o.faults;
        self.crashes += o.crashes;
        self.routed_deliveries += o.routed_deliveries;
        self.steps += o.steps;
        self.virtual_ms += o.virtual_ms;
    }
}

/// What a seed left: its violations, its figures and its step trace.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<Violation>,
    pub figures: Figures,
    pub trace: Vec<String>,
}

/// Runs `f` to its end at once (every port here completes without
/// waiting); `None` when the invocation crashed (an injected crash).
fn invoke<T>(f: impl std::future::Future<Output = T>) -> Option<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| memory::ready(f))) {
        Ok(v) => Some(v),
        Err(p) => {
            let crash = p.downcast_ref::<String>().is_some_and(|m| m.starts_with(memory::CRASH));
            if !crash {
                std::panic::resume_unwind(p);
            }
            None
        }
    }
}

/// Silences the panic messages of injected crashes (others print as usual).
pub fn quiet_crashes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let crash = info.payload().downcast_ref::<String>().is_some_and(|m| m.starts_with(memory::CRASH));
        if !crash {
            default(info);
        }
    }));
}

struct SimSecrets;

impl SecretResolver for SimSecrets {
    fn resolve<'a>(
        &'a self,
        reference: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Secret, String>> + Send + 'a>> {
        Box::pin(async move {
            match reference {
                "env:STRIPE" => Ok(Secret::new(STRIPE_SECRET)),
                "env:SVIX" => Ok(Secret::new(SVIX_SECRET)),
                "env:HMAC" => Ok(Secret::new(HMAC_SECRET)),
                other => Err(format!("unknown {other}")),
            }
        })
    }
}

/// No certificate is fetched here (no SNS endpoint).
struct NoFetch;

impl hookledger::verify::certificates::HttpsGet for NoFetch {
    fn get<'a>(
        &'a self,
        _url: &'a url::Url,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<u8>, hookledger::verify::certificates::FetchError>> + Send + 'a,
        >,
    > {
        Box::pin(async {
            Err(hookledger::verify::certificates::FetchError::Failed("no fetch in the simulator".into()))
        })
    }
}

/// A count per event, guarded by nothing but the commit's fence: the
/// projection a team writes when it trusts the core's effectively-once.
struct Tally;

pub const TALLY_PK: &str = "sim#tally#t1";
pub const FETCHED_PK: &str = "sim#fetched#t1";

impl Projection for Tally {
    fn name(&self) -> &'static str {
        "sim_tally"
    }
    fn handles(&self, provider: &str, event_type: &str) -> bool {
        provider == "hmac" && event_type == "thing.counted"
    }
    fn plan<'a>(&'a self, _ev: &'a EventContext, _cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let add = Write::update(TALLY_PK, "ADD #c :one").name("#c", "count").value(":one", n(1));
            Ok(Decision::Apply(vec![Op::new(vec![add], OnConflict::Stale)]))
        })
    }
}

/// A notification's projection: fetch the truth (here: note when).
struct Fetch;

impl Projection for Fetch {
    fn name(&self) -> &'static str {
        "sim_fetch"
    }
    fn handles(&self, provider: &str, _event_type: &str) -> bool {
        provider == "dropbox"
    }
    fn plan<'a>(&'a self, ev: &'a EventContext, _cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let at = ev.processing_at_ms;
            let set = Write::update(FETCHED_PK, "SET fetched_at = :t")
                .when("attribute_not_exists(fetched_at) OR fetched_at < :t")
                .value(":t", n(at));
            Ok(Decision::Apply(vec![Op::new(vec![set], OnConflict::Stale)]))
        })
    }
}

fn routes() -> Arc<hookledger::routes::Routes> {
    let json = format!(
        r#"{{"destinations": {{"orders": {{"arn": "{QUEUE_ARN}"}}, "bus": {{"arn": "{BUS_ARN}", "source": "sim.products"}},
              "{PARTNER}": {{"url": "https://hooks.partner.example/sim", "secrets": ["env:PARTNER"]}}}},
            "routes": [{{"provider": "stripe", "type": "product.*", "to": ["orders", "bus", "{PARTNER}"]}}]}}"#
    );
    Arc::new(hookledger::routes::Routes::parse(&json).expect("the simulator's routes"))
}

/// The deployment, shared with the world's interleaving hook.
struct Parts {
    world: World,
    clock: Arc<ManualClock>,
    intake: Intake<MemLedger, MemQueue>,
    processor: Arc<Proc>,
    reconciler: Recon,
    backfill: Backfill<MemLedger, MemQueue, memory::MemSource>,
    ops: Ops<MemQueue, MemLedger>,
    deliveries: hookledger::outbox::Deliveries<MemOutbox>,
    queue: MemQueue,
    /// The delivery queue's consumer (the processor function's second source).
    dispatcher: Outbox,
}

/// The mutable state of a seed, behind one lock (one thread runs a seed;
/// the lock is never held across a port call).
struct Sched {
    rng: Rng,
    trace: Vec<String>,
    events: Vec<Event>,
    /// Deliveries by due time (then order of scheduling).
    pending: BTreeMap<(i64, u64), Delivery>,
    next_id: u64,
    acknowledged: BTreeSet<String>,
    /// Notifications answered 2xx (their times).
    notified: Vec<i64>,
    figures: Figures,
    /// The key the outermost processor invocation is working on.
    working: Option<EventKey>,
    knobs: Knobs,
    violations: Vec<Violation>,
    watch: Watch,
    /// Backfill runs due (times).
    backfills: Vec<i64>,
}

pub struct Sim {
    seed: u64,
    parts: Arc<Parts>,
    sched: Arc<Mutex<Sched>>,
    depth: Arc<AtomicU32>,
}

impl Sim {
    pub fn new(seed: u64, knobs: Knobs) -> Self {
        let mut rng = Rng::new(seed);
        let drawn = draw(&mut rng);
        let clock = Arc::new(ManualClock::at(START_MS));
        let ambient = Ambient { clock: clock.clone(), entropy: Arc::new(SeededEntropy::new(seed)) };
        let world = World::new(ambient.clone()).with_shards(SHARDS);
        let specs = config::parse_endpoints(ENDPOINTS).expect("the simulator's endpoints");
        let certs = Arc::new(hookledger::verify::certificates::CertificateCache::new(Arc::new(NoFetch)));
        let endpoints =
            memory::ready(config::build_endpoints(specs, &SimSecrets, certs, None)).expect("the simulator's endpoints");
        let settings = Settings {
            table_name: "memory".into(),
            queue_url: "memory".into(),
            max_body_bytes: 256 * 1024,
            retention_days: 30,
            index_shards: SHARDS,
            payload_bucket: None,
        };
        let mut intake = Intake::new(endpoints, settings, world.ledger(), world.queue()).with_ambient(ambient.clone());
        if drawn.large_batches {
            intake.set_large_batch_over(1);
        }
        let payloads: Arc<dyn hookledger::ports::EventPayloads> = Arc::new(world.ledger());
        let destinations: Vec<String> = routes().destinations().iter().map(|d| d.name.clone()).collect();
        let dispatcher = || {
            Dispatcher::with_ports(world.outbox(), world.publisher())
                .with_ambient(ambient.clone())
                .with_payloads(payloads.clone())
                .with_queue(Arc::new(world.deliveries()))
                .with_destinations(destinations.clone())
        };
        let subscriptions = Arc::new(memory::MemSubscriptions::default());
        subscriptions.answer("sub_c", memory::Answer::Is("active".into(), SUBSCRIPTION_SEATS));
        let source: Arc<dyn hookledger::projection::fetch::SubscriptionSource> = subscriptions.clone();
        let registry = hookledger_app::reference_registry(Some(source), Some(NOTIFY_ARN.to_owned()))
            .register(Tally)
            .register(Fetch);
        let rechecks = registry.rechecks();
        let processor_settings = ProcessorSettings { index_shards: SHARDS, ..ProcessorSettings::default() };
        let processor = Processor::with_ports(
            world.ledger(),
            world.projection_context(),
            registry,
            Some(dispatcher()),
            processor_settings,
        )
        .with_queue(world.queue())
        .with_ambient(ambient.clone())
        .with_routes(routes());
        let reconciler = Reconciler::new(
            world.ledger(),
            world.queue(),
            Some(dispatcher()),
            rechecks,
            ReconcilerSettings::default().with_lookahead_for(&processor_settings),
        )
        .with_ambient(ambient.clone());
        let backfill = Backfill::new(
            world.ledger(),
            world.queue(),
            memory::MemSource::new(drawn.listed, 4),
            hookledger::backfill::BackfillSettings::default(),
        )
        .with_ambient(ambient.clone());
        let ops = Ops::new(world.ledger(), world.queue());
        let deliveries = hookledger::outbox::Deliveries::new(world.outbox(), SHARDS);
        let parts = Parts {
            dispatcher: dispatcher(),
            queue: world.queue(),
            world,
            clock,
            intake,
            processor: Arc::new(processor),
            reconciler,
            backfill,
            ops,
            deliveries,
        };
        let mut sched = Sched {
            rng,
            trace: Vec::new(),
            events: drawn.events,
            pending: BTreeMap::new(),
            next_id: 0,
            acknowledged: drawn.owed.into_iter().collect(),
            notified: Vec::new(),
            figures: Figures { seeds: 1, ..Figures::default() },
            working: None,
            knobs,
            violations: Vec::new(),
            watch: Watch::default(),
            backfills: BACKFILL_AT_MS.iter().map(|t| START_MS + t).collect(),
        };
        sched.figures.events = sched.events.iter().map(|e| e.facts.len().max(1) as u64).sum();
        for (at, d) in drawn.first {
            schedule(&mut sched, at, d);
        }
        Self { seed, parts: Arc::new(parts), sched: Arc::new(Mutex::new(sched)), depth: Arc::new(AtomicU32::new(0)) }
    }

    fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> i64 {
        self.parts.clock.now_ms()
    }

    fn note(&self, line: String) {
        let t = self.now() - START_MS;
        self.sched().trace.push(format!("{:>9}.{:03} {line}", t / 1000, t % 1000));
    }

    // ------------------------------------------------------------ scenario
}

/// What a seed's providers will do.
struct Drawn {
    events: Vec<Event>,
    /// First deliveries (and providers' own repeats).
    first: Vec<(i64, Delivery)>,
    /// Stripe's list of its events (for backfill), newest first.
    listed: Vec<hookledger::ports::SourceEvent>,
    /// Keys owed though never sent (the provider lists them).
    owed: Vec<String>,
    /// Whether the intake claims every batch of two or more whole (split by the processor).
    large_batches: bool,
}

/// Draws the seed's events, their first deliveries and the provider's list
/// (Stripe's, for backfill: some of its events are never sent).
fn draw(rng: &mut Rng) -> Drawn {
    {
        let mut events: Vec<Event> = Vec::new();
        let one = |endpoint: &'static str, provider: &str, id: String, body: serde_json::Value, fact: Fact| Event {
            endpoint,
            facts: vec![(EventKey::new(provider, endpoint, &id).as_str().to_owned(), fact)],
            event_id: id,
            body: body.to_string().into_bytes(),
        };
        // Payments on a mapped customer: one ledger entry each.
        for i in 0..rng.range(1, 4) {
            let amount = rng.range(1, 9) * 100;
            let id = format!("evt_pay_{i}");
            let body = json!({"id": id, "object": "event", "type": "payment_intent.succeeded",
                "data": {"object": {"id": format!("pi_{i}"), "object": "payment_intent", "customer": "cus_m", "amount": amount, "amount_received": amount}}});
            let state = account_ledger::balance_pk(TENANT, "acct_m");
            events.push(one("stripe", "stripe", id, body, Fact::Payment { state, amount }));
        }
        // Subscription changes: the entitlement fetched from the provider, a
        // notification published when it changes.
        for i in 0..rng.range(0, 2) {
            let id = format!("evt_sub_{i}");
            let body = json!({"id": id, "object": "event", "type": "customer.subscription.updated",
                "data": {"object": {"id": "sub_c", "object": "subscription", "customer": "cus_m", "status": "active", "quantity": 1}}});
            let state = entitlement::entitlement_pk(TENANT, "sub_c");
            events.push(one("stripe", "stripe", id, body, Fact::Subscription { state, seats: SUBSCRIPTION_SEATS }));
        }
        // Routed events (no projection): delivered to a queue, a bus and an HTTPS partner.
        for i in 0..rng.range(1, 3) {
            let id = format!("evt_prod_{i}");
            let body = json!({"id": id, "object": "event", "type": "product.updated", "data": {"object": {"id": format!("prod_{i}")}}});
            events.push(one("stripe", "stripe", id, body, Fact::Routed));
        }
        // An ordered stream of deltas.
        for seq in 1..=rng.range(1, 4) {
            let delta = rng.range(-3, 9);
            let body = json!({"type": "inventory.adjusted", "data": {"sku": "sku-1", "seq": seq, "delta": delta}});
            let state = inventory::inventory_pk(TENANT, "sku-1");
            events.push(one("svix", "standard_webhooks", format!("msg_inv_{seq}"), body, Fact::Delta { state, delta }));
        }
        // Snapshots by revision.
        for revision in 1..=rng.range(1, 4) {
            let seats = rng.range(1, 50);
            let body =
                json!({"type": "seats.snapshot", "data": {"account": "acct_s", "revision": revision, "seats": seats}});
            let state = seats::seats_pk(TENANT, "acct_s");
            let fact = Fact::Snapshot { state, revision, seats };
            events.push(one("svix", "standard_webhooks", format!("msg_seats_{revision}"), body, fact));
        }
        // Counted things (the fence alone).
        for i in 0..rng.range(1, 3) {
            let id = format!("thing_{i}");
            let body = json!({"id": id, "type": "thing.counted"});
            events.push(one("acme", "hmac", id, body, Fact::Tally { state: TALLY_PK.into() }));
        }
        // Quiltt: deltas of another stream in batches of one to three, each
        // element its own record (identity per element).
        let n_quiltt = rng.range(0, 5);
        let mut seq = 1;
        while seq <= n_quiltt {
            let size = rng.range(1, 3).min(n_quiltt - seq + 1);
            let mut elements = Vec::new();
            let mut facts = Vec::new();
            for q in seq..seq + size {
                let (id, delta) = (format!("qt_{q}"), rng.range(-5, 10));
                elements.push(json!({"id": id, "type": "inventory.adjusted", "at": "2027-01-15T08:00:00Z",
                    "profile": {"id": "p_sim"}, "record": {"id": "rec_sim"},
                    "data": {"sku": "sku-q", "seq": q, "delta": delta}}));
                let state = inventory::inventory_pk(TENANT, "sku-q");
                facts.push((EventKey::new("quiltt", "quiltt", &id).as_str().to_owned(), Fact::Delta { state, delta }));
            }
            let body = json!({"environment": {"id": "env_sim", "mode": "sandbox"},
                "eventTypes": ["inventory.adjusted"], "events": elements});
            events.push(Event {
                endpoint: "quiltt",
                event_id: format!("qt_{seq}"),
                facts,
                body: body.to_string().into_bytes(),
            });
            seq += size;
        }
        // Notifications: the same bytes every time ("this account changed").
        let body = br#"{"list_folder":{"accounts":["dbid:sim"]},"delta":{"users":[7]}}"#.to_vec();
        for i in 0..rng.range(0, 3) {
            events.push(Event {
                endpoint: "dropbox",
                event_id: format!("signal_{i}"),
                facts: Vec::new(),
                body: body.clone(),
            });
        }
        // First deliveries, spread; some sent twice by their provider; some
        // Stripe events never sent at all (only its list has them: backfill).
        let (mut listed, mut first, mut owed) = (Vec::new(), Vec::new(), Vec::new());
        for (i, e) in events.iter().enumerate() {
            let at = START_MS + rng.range(0, SPREAD_MS);
            if e.endpoint == "stripe" {
                listed.push(hookledger::ports::SourceEvent {
                    event_id: e.event_id.clone(),
                    event_type: None,
                    created_s: at / 1000,
                    body: Some(e.body.clone()),
                    handle: None,
                });
                if rng.per_mille(150) {
                    // Owed all the same: the provider lists it.
                    owed.extend(e.facts.iter().map(|(k, _)| k.clone()));
                    continue;
                }
            }
            first.push((at, Delivery { event: i, attempt: 0 }));
            if rng.per_mille(250) {
                let again = at + rng.range(0, 120_000);
                first.push((again, Delivery { event: i, attempt: 0 }));
            }
        }
        listed.sort_by_key(|e| std::cmp::Reverse(e.created_s));
        Drawn { events, first, listed, owed, large_batches: rng.per_mille(500) }
    }
}

impl Sim {
    // --------------------------------------------------------------- steps

    /// A provider sends event `d.event` now; not answered 2xx: it retries.
    fn deliver(&self, d: Delivery) {
        let now = self.now();
        let (event, attempt) = {
            let sc = self.sched();
            (sc.events[d.event].clone(), d.attempt)
        };
        let headers = sign(&event, now / 1000);
        let at = UNIX_EPOCH + Duration::from_millis(now as u64);
        let request_id = format!("req-{}-{}", d.event, attempt);
        let req = IntakeRequest {
            endpoint: event.endpoint,
            method: &Method::POST,
            query: "",
            headers: &headers,
            body: &event.body,
            now: at,
            request_id: &request_id,
        };
        let answer = invoke(self.parts.intake.handle(req));
        let mut sc = self.sched();
        sc.figures.deliveries += 1;
        let status = answer.as_ref().map(|a| a.status);
        let ok = status.is_some_and(|st| (200..300).contains(&st));
        let line = match &answer {
            Some(a) => format!("deliver {} {} #{attempt} -> {} {}", event.endpoint, event.event_id, a.status, a.code),
            None => format!("deliver {} {} #{attempt} -> crashed", event.endpoint, event.event_id),
        };
        if ok {
            sc.acknowledged.extend(event.facts.iter().map(|(k, _)| k.clone()));
            if event.facts.is_empty() {
                sc.notified.push(now);
            }
        } else {
            let wait = RETRIES_MS.get(attempt).copied().unwrap_or(7_200_000);
            schedule(&mut sc, now + wait, Delivery { event: d.event, attempt: attempt + 1 });
        }
        drop(sc);
        self.note(line);
    }

    /// One processor invocation on up to `max` visible messages: each is
    /// processed as the SQS handler does; the messages it reports done are
    /// deleted when the invocation returns (none when it crashed).
    fn process(&self, max: usize) {
        let batch = self.parts.queue.receive(max);
        if batch.is_empty() {
            return;
        }
        self.sched().figures.invocations += 1;
        let mut done = Vec::new();
        for m in &batch {
            self.sched().working = m.work.as_ref().map(|(k, _)| k.clone());
            let fate = invoke(hookledger::batch::one(self.parts.processor.as_ref(), &self.parts.queue, m));
            self.sched().working = None;
            match fate {
                Some(delete) => {
                    let key = m.work.as_ref().map_or("?".to_owned(), |(k, _)| k.as_str().to_owned());
                    self.note(format!("process {key} -> {}", if delete { "done" } else { "stays" }));
                    if delete {
                        done.extend(m.receipt.clone());
                    }
                }
                None => {
                    self.note("process -> crashed (the batch comes back)".into());
                    self.sched().figures.crashes += 1;
                    return;
                }
            }
        }
        for receipt in done {
            self.parts.queue.delete(&receipt);
        }
    }

    /// One dispatcher invocation on up to `max` visible delivery messages;
    /// a message whose take failed or crashed is visible again after the
    /// delivery queue's visibility timeout.
    fn dispatch(&self, max: usize) {
        let batch = self.parts.world.deliveries().receive(max);
        for m in &batch {
            let now = self.now();
            let what = match m {
                hookledger::ports::DeliveryMessage::Deliver { outbox, .. } => format!("deliver {outbox}"),
                hookledger::ports::DeliveryMessage::Drain { destination } => format!("drain {destination}"),
            };
            match invoke(self.parts.dispatcher.take(m, now)) {
                Some(Ok(outcome)) => self.note(format!("dispatch {what} -> {outcome:?}")),
                Some(Err(e)) => {
                    self.note(format!("dispatch {what} -> {e} (it comes back)"));
                    self.parts.world.deliveries().put_back(m, "", now + DELIVERY_VISIBILITY_MS);
                }
                None => {
                    self.note(format!("dispatch {what} -> crashed (it comes back)"));
                    self.sched().figures.crashes += 1;
                    self.parts.world.deliveries().put_back(m, "", now + DELIVERY_VISIBILITY_MS);
                }
            }
        }
    }

    fn reconcile(&self) {
        let deadline = self.parts.clock.instant() + Duration::from_secs(60);
        self.sched().figures.reconciler_runs += 1;
        match invoke(self.parts.reconciler.run(self.now(), deadline)) {
            Some(sum) => {
                let redriven: u64 = sum.redriven.values().sum();
                self.note(format!("reconcile -> redriven {redriven}, outbox republished {}", sum.outbox_republished));
            }
            None => {
                self.sched().figures.crashes += 1;
                self.note("reconcile -> crashed".into());
            }
        }
    }

    /// A provider's handshake: Dropbox's GET check, its challenge echoed
    /// as plain text, nothing recorded.
    fn handshake(&self) {
        let challenge = format!("sim{}", self.sched().rng.below(1_000_000));
        let query = format!("challenge={challenge}");
        let headers = HeaderMap::new();
        let req = IntakeRequest {
            endpoint: "dropbox",
            method: &Method::GET,
            query: &query,
            headers: &headers,
            body: b"",
            now: UNIX_EPOCH + Duration::from_millis(self.now() as u64),
            request_id: "req-handshake",
        };
        let before = self.records().len();
        let answer = invoke(self.parts.intake.handle(req));
        let echoed =
            answer.as_ref().is_some_and(|a| a.status == 200 && a.raw.as_ref().is_some_and(|(_, b)| *b == challenge));
        // A crash is the provider's to retry; any answer must be the echo.
        if answer.is_some() && !echoed {
            let got = answer.map(|a| (a.status, a.raw));
            self.sched().violations.push(Violation::new("other", format!("handshake answered {got:?}")));
        }
        if self.records().len() != before {
            self.sched().violations.push(Violation::new("other", "a handshake made a record"));
        }
        self.note(format!("handshake dropbox -> {}", if echoed { "echoed" } else { "not answered" }));
    }

    /// A backfill run of the Stripe endpoint over everything up to now.
    fn backfill(&self) {
        let now = self.now();
        let target = Target {
            provider: "stripe".into(),
            endpoint: "stripe".into(),
            tenant: TENANT.into(),
            retention_days: 30,
            index_shards: SHARDS,
            mode: Mode::Import,
            payload: Default::default(),
            erasable: false,
        };
        let window =
            hookledger::ports::Window { since_s: START_MS / 1000 - 60, until_s: now / 1000 + 1, types: Vec::new() };
        let deadline = self.parts.clock.instant() + Duration::from_secs(60);
        match invoke(self.parts.backfill.run(&target, &window, false, now, deadline, |_| {})) {
            Some(sum) => {
                self.note(format!(
                    "backfill stripe -> seen {}, recovered {}, failed {}, complete {}",
                    sum.seen, sum.recovered, sum.failed, sum.complete
                ));
                if !sum.complete {
                    // Read again (from its cursor) a minute later.
                    self.sched().backfills.push(now + 60_000);
                }
            }
            None => {
                self.sched().figures.crashes += 1;
                self.note("backfill stripe -> crashed".into());
                self.sched().backfills.push(now + 60_000);
            }
        }
    }

    /// An operator parks a record during the storm (the runbook replays it
    /// later), or replays one (usually refused: it is not DEAD or PARKED).
    fn operate(&self) {
        let keys = self.record_keys();
        if keys.is_empty() {
            return;
        }
        let (pick, park, delivery) = {
            let mut sc = self.sched();
            (sc.rng.below(keys.len() as u64) as usize, sc.rng.per_mille(500), sc.rng.per_mille(300))
        };
        let Some(key) = EventKey::from_stored(&keys[pick]) else { return };
        let now = self.now();
        if delivery {
            // Deliveries replay: only a DEAD delivery is sent again (under its key).
            let states = invoke(self.parts.deliveries.of_event(&key, &["orders", "bus", PARTNER]));
            for state in states.and_then(Result::ok).unwrap_or_default() {
                let token = format!("op-{now}");
                let got = invoke(self.parts.deliveries.replay(
                    &state,
                    &token,
                    &hookledger::audit::Caller::named("sim-operator"),
                    "a second look",
                    now,
                ));
                let what = match got {
                    Some(Ok(replayed)) => format!("replayed {replayed}"),
                    Some(Err(e)) => format!("error ({})", short(&e.to_string())),
                    None => "crashed".into(),
                };
                self.note(format!("operator deliveries replay {} -> {what}", state.id));
            }
            return;
        }
        let answer = if park {
            invoke(self.parts.ops.park(
                &key,
                &hookledger::audit::Caller::named("sim-operator"),
                "holding it for a look",
                now,
            ))
        } else {
            invoke(self.parts.ops.replay(&key, &hookledger::audit::Caller::named("sim-operator"), "a second look", now))
        };
        let what = if park { "park" } else { "replay" };
        let result = match answer {
            Some(Ok(())) => "ok".to_owned(),
            Some(Err(e)) => format!("refused ({})", short(&e.to_string())),
            None => "crashed".to_owned(),
        };
        self.note(format!("operator {what} {key} -> {result}"));
    }

    /// The interleaving hook: before a port call of the outermost
    /// invocation, now and then another invocation runs to its end.
    fn interleave(&self, call: &str) {
        if self.depth.load(Ordering::SeqCst) > 0 {
            return;
        }
        let choice = {
            let mut sc = self.sched();
            let p = sc.knobs.preempt_per_mille;
            if !sc.rng.per_mille(p) {
                return;
            }
            sc.figures.interleavings += 1;
            (sc.rng.below(3), sc.working.clone())
        };
        self.depth.fetch_add(1, Ordering::SeqCst);
        match choice {
            // A second worker takes the record over once the lease expired.
            (0, Some(key)) => {
                let lease = ProcessorSettings::default().lease_ms;
                self.parts.world.advance(Duration::from_millis(lease as u64 + 1));
                let now = self.now();
                let got = invoke(self.parts.processor.process(&key, now));
                let what = match got {
                    Some(Ok(r)) => format!("{:?}", r.outcome),
                    Some(Err(e)) => format!("error ({})", short(&e.to_string())),
                    None => "crashed".into(),
                };
                self.note(format!("  at {call}: a second worker takes {key} over -> {what}"));
            }
            // Another copy of an event arrives meanwhile.
            (1, _) | (0, None) => {
                let event = {
                    let mut sc = self.sched();
                    let n = sc.events.len() as u64;
                    sc.rng.below(n) as usize
                };
                self.note(format!("  at {call}: a concurrent copy"));
                self.deliver(Delivery { event, attempt: 0 });
            }
            _ => {
                self.note(format!("  at {call}: a reconciler run"));
                self.reconcile();
            }
        }
        self.depth.fetch_sub(1, Ordering::SeqCst);
    }

    // ---------------------------------------------------------- the driver

    /// Runs the seed to its end and checks it.
    pub fn run(self) -> Outcome {
        let knobs = self.sched().knobs;
        // Every mapping is in place before the storm (an unknown customer is the chaos seeds').
        let mapping = hookledger_app::subjects::mapping("stripe", TENANT, "cus_m", "acct_m");
        self.parts.world.apply(&[Op::new(vec![mapping], OnConflict::Stale)]).expect("the mapping");
        {
            let sim = Sim {
                seed: self.seed,
                parts: self.parts.clone(),
                sched: self.sched.clone(),
                depth: self.depth.clone(),
            };
            self.parts.world.preempt(Some(Arc::new(move |_w: &World, call: &str| sim.interleave(call))));
        }
        self.parts.world.random_faults(knobs.faults_per_mille);
        self.parts.world.random_crashes(knobs.crashes_per_mille);
        // An outage of the routes' queue during the storm.
        let (outage_from, outage_to) = {
            let mut sc = self.sched();
            let from = START_MS + sc.rng.range(0, STORM_MS / 2);
            (from, from + sc.rng.range(60_000, STORM_MS / 2))
        };
        let storm_end = START_MS + STORM_MS;
        let bound = storm_end + LIVENESS_MS;
        let mut storm = true;
        let mut outage = false;
        let mut next_reconcile = START_MS + RECONCILE_EVERY_MS;
        let mut settled_once = false;
        let mut steps = 0;
        loop {
            steps += 1;
            let now = self.now();
            if storm && now >= storm_end {
                storm = false;
                self.parts.world.clear_faults();
                // One backfill after the storm reads the whole list.
                self.sched().backfills.push(now + 5 * 60_000);
                self.note("storm over: no more faults".into());
            }
            let in_outage = (outage_from..outage_to).contains(&now);
            if in_outage != outage {
                outage = in_outage;
                let partner = hookledger::routes::https_reference(PARTNER);
                for target in [QUEUE_ARN, partner.as_str()] {
                    if outage {
                        self.parts.world.publisher().refuse(target);
                    } else {
                        self.parts.world.publisher().restore(target);
                    }
                }
                self.note(format!("the routes' queue and partner {}", if outage { "are down" } else { "are back" }));
            }
            self.watch();
            if steps > MAX_STEPS || now > bound {
                let open = self.open();
                self.sched().violations.push(Violation::new(
                    "liveness",
                    format!("not settled {} min after the storm: {}", (now - storm_end) / 60_000, open.join(", ")),
                ));
                break;
            }
            let due = self.sched().pending.first_key_value().map(|(k, _)| k.0);
            let visible = self.visible(now);
            let reconcile_due = now >= next_reconcile;
            let mut enabled = Vec::new();
            if due.is_some_and(|t| t <= now) {
                enabled.push(0);
            }
            if visible {
                enabled.push(1);
            }
            if reconcile_due {
                enabled.push(2);
            }
            if storm {
                enabled.push(3);
            }
            let backfill_due = self.sched().backfills.iter().min().copied();
            if backfill_due.is_some_and(|t| t <= now) {
                enabled.push(4);
            }
            let delivery_due = self.parts.world.deliveries().next_visible();
            if delivery_due.is_some_and(|t| t <= now) {
                enabled.push(5);
            }
            let pick = {
                let mut sc = self.sched();
                let i = sc.rng.below(enabled.len() as u64 + 1) as usize;
                // Now and then time passes between two steps (leases expire meanwhile).
                let pass = sc.rng.per_mille(40).then(|| sc.rng.range(1_000, 45_000));
                (enabled.get(i).copied(), pass)
            };
            match pick {
                (Some(0), _) => {
                    let d = {
                        let mut sc = self.sched();
                        sc.pending.pop_first().map(|(_, d)| d)
                    };
                    if let Some(d) = d {
                        self.deliver(d);
                    }
                }
                (Some(1), _) => {
                    let max = self.sched().rng.range(1, 3) as usize;
                    self.process(max);
                }
                (Some(2), _) => {
                    next_reconcile = now + RECONCILE_EVERY_MS;
                    self.reconcile();
                }
                (Some(3), _) => {
                    let (operate, handshake) = {
                        let mut sc = self.sched();
                        (sc.rng.per_mille(30), sc.rng.per_mille(20))
                    };
                    if operate {
                        self.operate();
                    } else if handshake {
                        self.handshake();
                    }
                }
                (Some(4), _) => {
                    {
                        let mut sc = self.sched();
                        let i = sc.backfills.iter().position(|t| *t <= now).expect("a backfill due");
                        sc.backfills.remove(i);
                    }
                    self.backfill();
                }
                (Some(5), _) => {
                    let max = self.sched().rng.range(1, 4) as usize;
                    self.dispatch(max);
                }
                (_, Some(pass)) => self.parts.world.advance(Duration::from_millis(pass as u64)),
                _ => {
                    // Nothing chosen: time moves to the next thing that happens.
                    if enabled.iter().all(|&e| e == 3) {
                        if !storm && self.open().is_empty() {
                            if settled_once {
                                break;
                            }
                            settled_once = true;
                            self.runbook();
                            continue;
                        }
                        let next = [due, self.next_visible(), Some(next_reconcile), backfill_due, delivery_due]
                            .into_iter()
                            .flatten()
                            .min()
                            .unwrap_or(next_reconcile)
                            .max(now + 1);
                        self.parts.world.advance(Duration::from_millis((next - now) as u64));
                    }
                }
            }
        }
        self.parts.world.preempt(None);
        let mut sc = self.sched();
        sc.figures.steps = steps as u64;
        sc.figures.faults = self.parts.world.state().injected;
        sc.figures.virtual_ms = self.now() - START_MS;
        sc.figures.routed_deliveries =
            self.parts.world.publisher().published().iter().filter(|p| p.topic_arn != NOTIFY_ARN).count() as u64;
        let expected = self.expected(&sc);
        let observed = self.observed();
        let mut violations = std::mem::take(&mut sc.violations);
        violations.extend(check::outcomes(&expected, &observed));
        violations.sort();
        violations.dedup();
        Outcome { seed: self.seed, violations, figures: sc.figures, trace: std::mem::take(&mut sc.trace) }
    }

    /// The operator's runbook once the world settled: check the statuses,
    /// then replay what is PARKED.
    fn runbook(&self) {
        let expected = self.expected(&self.sched());
        let found = check::statuses(&expected, &self.observed());
        self.sched().violations.extend(found);
        self.note("settled: the runbook replays what is PARKED".into());
        for r in self.records() {
            if get_s(&r, "status") == Some("PARKED") {
                let key = EventKey::from_stored(get_s(&r, "pk").unwrap_or_default()).expect("a stored key");
                let now = self.now();
                if let Some(Err(e)) = invoke(self.parts.ops.replay(
                    &key,
                    &hookledger::audit::Caller::named("sim-operator"),
                    "runbook",
                    now,
                )) {
                    self.sched().violations.push(Violation::new("other", format!("runbook replay of {key}: {e}")));
                }
            }
        }
    }

    fn expected(&self, sc: &Sched) -> Expected {
        let mut sent: Vec<Sent> = sc
            .events
            .iter()
            .flat_map(|e| e.facts.iter().map(|(key, fact)| Sent { key: key.clone(), fact: fact.clone() }))
            .collect();
        if let Some(at) = sc.notified.iter().max() {
            sent.push(Sent { key: String::new(), fact: Fact::Notification { state: FETCHED_PK.into(), at_ms: *at } });
        }
        Expected {
            sent,
            acknowledged: sc.acknowledged.clone(),
            parked_ok: Some(|why| why.starts_with("operator") || why == "gap"),
        }
    }

    fn observed(&self) -> Observed {
        let items: Vec<Item> = self.parts.world.state().table.items().cloned().map(to_domain).collect();
        let mut arrivals: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in self.parts.world.publisher().published() {
            let destination = match p.topic_arn.as_str() {
                QUEUE_ARN => "orders",
                BUS_ARN => "bus",
                NOTIFY_ARN => "",
                other if other == hookledger::routes::https_reference(PARTNER) => PARTNER,
                other => other,
            };
            arrivals.entry(destination.to_owned()).or_default().push(p.idempotency_key);
        }
        Observed { items, arrivals }
    }

    fn records(&self) -> Vec<Item> {
        let st = self.parts.world.state();
        let meta = |i: &&memory::expr::Item| i.get("sk").and_then(|v| v.as_s().ok()).is_some_and(|s| s == "meta");
        st.table.items().filter(meta).cloned().map(to_domain).collect()
    }

    fn record_keys(&self) -> Vec<String> {
        self.records().iter().filter_map(|r| get_s(r, "pk").map(str::to_owned)).collect()
    }

    /// What keeps the world from being settled (empty: settled).
    fn open(&self) -> Vec<String> {
        let mut open = Vec::new();
        let sc = self.sched();
        if let Some((at, d)) = sc.pending.first_key_value() {
            open.push(format!("{} deliveries pending (next: event {} at {})", sc.pending.len(), d.event, at.0));
        }
        if !sc.backfills.is_empty() {
            open.push(format!("{} backfill runs due", sc.backfills.len()));
        }
        drop(sc);
        let st = self.parts.world.state();
        if !st.queue.messages.is_empty() {
            open.push(format!("{} messages queued", st.queue.messages.len()));
        }
        if !st.deliveries.is_empty() {
            open.push(format!("{} delivery messages queued", st.deliveries.len()));
        }
        // Read in place (no copy of every item on every look).
        let text = |i: &memory::expr::Item, name: &str| i.get(name).and_then(|v| v.as_s().ok()).cloned();
        for i in st.table.items() {
            let (sk, status) = (text(i, "sk").unwrap_or_default(), text(i, "status").unwrap_or_default());
            let open_record = sk == "meta" && !matches!(status.as_str(), "PROCESSED" | "PARKED" | "DEAD");
            let open_item = sk == "outbox" && !matches!(status.as_str(), "SENT" | "DEAD");
            if open_record || open_item {
                open.push(format!("{} {status}", text(i, "pk").unwrap_or_default()));
            }
        }
        open
    }

    fn visible(&self, now: i64) -> bool {
        self.parts.world.state().queue.messages.iter().any(|m| m.visible_at_ms <= now)
    }

    fn next_visible(&self) -> Option<i64> {
        self.parts.world.state().queue.messages.iter().map(|m| m.visible_at_ms).min()
    }

    /// Guarded projections never go back, seen after every step.
    fn watch(&self) {
        let items: Vec<(String, Option<Item>)> = [
            seats::seats_pk(TENANT, "acct_s"),
            inventory::inventory_pk(TENANT, "sku-1"),
            account_ledger::balance_pk(TENANT, "acct_m"),
        ]
        .into_iter()
        .map(|pk| {
            let item = self.parts.world.state_item(&pk);
            (pk, item)
        })
        .collect();
        let mut sc = self.sched();
        for (pk, item) in items {
            if let Some(v) = sc.watch.see(&pk, item.as_ref(), &["revision", "last_seq", "entries"]) {
                sc.violations.push(v);
            }
        }
    }
}

fn schedule(sc: &mut Sched, at: i64, d: Delivery) {
    sc.next_id += 1;
    let id = sc.next_id;
    sc.pending.insert((at, id), d);
}

fn to_domain(i: memory::expr::Item) -> Item {
    hookledger::adapters::dynamodb::item::item_from_sdk(&i)
}

fn short(s: &str) -> String {
    s.chars().take(80).collect()
}

/// The headers the event's provider signs a delivery with at `now_s`.
fn sign(e: &Event, now_s: i64) -> HeaderMap {
    let mut h = HeaderMap::new();
    let v = |s: &str| HeaderValue::from_str(s).expect("a header value");
    let hmac_hex = |body: &[u8]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(HMAC_SECRET.as_bytes()).expect("any key length");
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    };
    match e.endpoint {
        "stripe" => {
            h.insert(stripe::SIGNATURE_HEADER, v(&stripe::sign(&Secret::new(STRIPE_SECRET), now_s, &e.body)));
        }
        "svix" => {
            let key = standard::decode_secret(&Secret::new(SVIX_SECRET)).expect("a Standard Webhooks secret");
            h.insert("webhook-id", v(&e.event_id));
            h.insert("webhook-timestamp", HeaderValue::from(now_s));
            h.insert("webhook-signature", v(&standard::sign(&key, &e.event_id, now_s, &e.body)));
        }
        "acme" => {
            h.insert("x-sig", v(&format!("sha256={}", hmac_hex(&e.body))));
        }
        "quiltt" => {
            h.insert(quiltt::SIGNATURE_HEADER, v(&quiltt::sign(&Secret::new(HMAC_SECRET), now_s, &e.body)));
            h.insert(quiltt::TIMESTAMP_HEADER, HeaderValue::from(now_s));
        }
        "dropbox" => {
            h.insert("x-dropbox-signature", v(&hmac_hex(&e.body)));
        }
        other => unreachable!("no endpoint {other}"),
    }
    h.insert("content-type", v("application/json"));
    h
}

/// Runs one seed (with `bug` planted on this thread, if any).
pub fn run_seed(seed: u64, knobs: Knobs, bug: Option<hookledger::planted::Bug>) -> Outcome {
    hookledger::planted::plant(bug);
    let out = Sim::new(seed, knobs).run();
    hookledger::planted::plant(None);
    out
}
