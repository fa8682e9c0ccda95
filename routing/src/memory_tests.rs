//! What a routing table costs in memory: a counting allocator (this crate's unit tests
//! only) and tables of 10,000 instances shaped like the benchmark's (`table_rss`: 10
//! instances per agent, two capabilities, one shared by all, two tags, one metadata entry).
//!
//! The allocator counts per thread, so tests running in parallel do not disturb each
//! other's counts; sizes are those asked of the allocator (an allocator's size classes add
//! to them).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;

use agent_reach::model::{Instance, fixture};

use crate::table::{Change, Policies, RoutingTable};

struct Counting;

thread_local! {
    /// Bytes allocated and not yet freed by this thread (frees of blocks allocated by other
    /// threads count here too).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize) {
    // `try_with`: nothing to count once the thread's locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + bytes;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// (bytes still allocated, peak above the start) by `f` on this thread, and its result.
fn counted<T>(f: impl FnOnce() -> T) -> (isize, isize, T) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    (LIVE.with(Cell::get) - start, PEAK.with(Cell::get) - start, out)
}

/// Instance `i` of the benchmark's fleet.
fn instance(i: usize) -> Instance {
    fixture::instance(&format!("fleet-agent-{:05}-{:016x}", i / 10, i as u64 * 0x9e37_79b9))
        .agent(&format!("fleet-agent-{:05}", i / 10))
        .version("1.4.2")
        .capability(&format!("fleet.task-{:03}", (i / 10) % 200), &["en", "gpu-a10"])
        .capability("fleet.common", &[])
        .endpoint(&format!("http://127.0.0.1:{}", 10_000 + i % 50_000))
        .sidecar(&format!("fleet-sidecar-{:04}", i / 20), &format!("127.0.0.1:{}", 20_000 + i / 20))
        .metadata("zone", "zone-a")
        .revision(i as i64 + 1)
        .build()
}

fn fleet(n: usize) -> HashMap<String, Arc<Instance>> {
    (0..n).map(instance).map(|i| (i.record.instance_id.clone(), Arc::new(i))).collect()
}

const N: usize = 10_000;

#[test]
fn a_table_of_10000_instances_costs_its_records_and_under_300_bytes_per_instance() {
    let (records, _, instances) = counted(|| fleet(N));
    let (table_bytes, peak, table) = counted(|| RoutingTable::build(7, instances, Policies::default(), None));
    assert_eq!((table.len(), table.by_agent.len(), table.by_capability.len()), (N, N / 10, 201));
    let common = &table.by_capability["fleet.common"];
    assert_eq!((common.members.capacity(), common.up.capacity()), (N, N), "lists at their exact size");
    let agent = &table.by_agent["fleet-agent-00007"];
    assert_eq!(
        agent.by_tag.iter().map(|(t, l)| (t.as_str(), l.capacity())).collect::<Vec<_>>(),
        [("en", 10), ("gpu-a10", 10)]
    );
    let per = table_bytes / N as isize;
    eprintln!(
        "records {records} B ({} B/instance); table on top {table_bytes} B ({per} B/instance), peak while building \
         {peak} B",
        records / N as isize
    );
    // Before the breaker's and retry budget's state were allocated lazily and the lists
    // sized exactly, the same table cost 514 B/instance on top of the records.
    assert!(per < 300, "{per} B/instance");
    // Building holds the instance map, the member map and the groups at once, not more.
    assert!(peak < table_bytes + 2 * records / 5, "peak {peak} B");
}

#[test]
fn applying_a_change_keeps_one_table_and_frees_the_previous_one() {
    let table = RoutingTable::build(7, fleet(N), Policies::default(), None);
    let (steady, _, ()) = counted(|| drop(RoutingTable::build(7, fleet(N), Policies::default(), None)));
    assert!(steady.abs() < 1024, "a table dropped returns what it took: {steady} B");
    let change = Change { revision: 8, upserted: vec![instance(N)], ..Default::default() };
    let (after, peak, next) = counted(|| {
        let next = table.apply(change);
        drop(table);
        next
    });
    assert_eq!(next.len(), N + 1);
    // The new table replaces the old one: what stays is about one instance more.
    assert!(after < 4096, "{after} B more after the previous table was dropped");
    eprintln!("apply on 10,000: peak {peak} B above the previous table");
}
