//! `agent-reach demo` (the README's first command) end to end: the built binary exits 0
//! and prints what the README says it shows — the agents and where they run, the 4/4
//! round-robin spread, tag filtering, the traced three-agent chain, the unknown capability
//! with its suggestion, and no failed call after a kill.

use std::collections::BTreeSet;
use std::time::Duration;

fn is_instance_of(id: &str, agent: &str) -> bool {
    id.strip_prefix(agent)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|hex| hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The line after the one equal to `line`.
fn after<'a>(lines: &[&'a str], line: &str) -> &'a str {
    let at = lines.iter().position(|l| *l == line).unwrap_or_else(|| panic!("no line {line:?}"));
    lines.get(at + 1).copied().unwrap_or_default()
}

#[test]
fn the_demo_exits_0_and_shows_each_step() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .arg("demo")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run agent-reach demo");
    // The demo takes under a second; a hang fails the test instead of the whole run.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait for the demo").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("agent-reach demo still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("demo output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();

    assert_eq!(
        lines[0],
        "Agent-Reach demo: a control service, two sidecars and five agents in this process, on 127.0.0.1."
    );

    // The five agents: name, instance id (assigned by the sidecar), capability, host.
    let table = after(&lines, "Agents registered (each with its own sidecar, which assigned the instance id):");
    let at = lines.iter().position(|l| *l == table).unwrap();
    let agents: Vec<Vec<&str>> = lines[at..at + 5].iter().map(|l| l.split_whitespace().collect()).collect();
    let rows: BTreeSet<(&str, &str, &str, &str)> = agents.iter().map(|a| (a[0], a[2], a[3], a[5])).collect();
    let expected: BTreeSet<(&str, &str, &str, &str)> = [
        ("summarizer", "text.summarize", "[en]", "host-a"),
        ("summarizer", "text.summarize", "[en,zh]", "host-b"),
        ("translator", "text.translate", "[zh]", "host-b"),
        ("translator", "text.translate", "[zh,fr]", "host-a"),
        ("planner", "task.plan", "[demo]", "host-a"),
    ]
    .into();
    assert_eq!(rows, expected, "{stdout}");
    for a in &agents {
        assert!(is_instance_of(a[1], a[0]), "{a:?}");
    }
    let id = |capability: &str, tags: &str| -> String {
        agents.iter().find(|a| a[2] == capability && a[3] == tags).map(|a| a[1].to_string()).unwrap()
    };
    let (sum_en, sum_zh) = (id("text.summarize", "[en]"), id("text.summarize", "[en,zh]"));
    let (tr_zh, tr_fr, planner) =
        (id("text.translate", "[zh]"), id("text.translate", "[zh,fr]"), id("task.plan", "[demo]"));
    assert_eq!(
        lines[at + 5],
        "  both sidecars' routing tables hold all 5 instances (from the control service's watch stream)"
    );

    // 1. Round robin by policy: exactly 4 and 4 (ids in sorted order).
    let mut summarizers = [sum_en.clone(), sum_zh.clone()];
    summarizers.sort();
    assert_eq!(
        after(&lines, "   pushed to both sidecars through the watch stream); 8 more calls split exactly 4/4:"),
        format!("   spread: {} x4, {} x4", summarizers[0], summarizers[1])
    );

    // 2. Tags: the three [fr] calls go to the translator tagged fr.
    let fr = format!("   -> {tr_fr} on host-a: \"[fr] bonjour\"");
    assert_eq!(lines.iter().filter(|l| **l == fr).count(), 3, "{stdout}");

    // 3. The chain, summarized by a summarizer and translated by a translator tagged zh.
    let chain = after(
        &lines,
        "3. A chain: a client calls task.plan; the planner calls text.summarize, then text.translate [zh]:",
    );
    let prefix = format!("   -> {planner} on host-a: [zh] customers in three regions …  (summarized by ");
    let rest = chain.strip_prefix(&prefix).unwrap_or_else(|| panic!("{chain:?}"));
    let (summarizer, translator) =
        rest.strip_suffix(')').and_then(|r| r.split_once(", translated by ")).unwrap_or_else(|| panic!("{chain:?}"));
    assert!([&sum_en, &sum_zh].contains(&&summarizer.to_string()), "{chain}");
    assert!([&tr_zh, &tr_fr].contains(&&translator.to_string()), "{chain}");
    // Its trace: the planner's call and the planner's two calls, three spans each.
    let trace = lines.iter().find(|l| l.starts_with("trace ")).expect("the chain's trace");
    let (trace_id, spans) = trace["trace ".len()..].split_once(": ").unwrap();
    assert!(trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()), "{trace}");
    assert_eq!(spans, "9 span(s)");

    // 4. The unknown capability and its suggestion.
    assert!(
        lines.contains(
            &"   text.summarise -> NotFound AGENT_NOT_FOUND: no agent offers capability text.summarise; did you mean text.summarize?"
        ),
        "{stdout}"
    );

    // 6. After the kill, six calls, none to the killed translator, all succeeded.
    let kill =
        format!("6. With text.translate on round_robin, kill translator {tr_zh} on host-b without deregistering,");
    let at = lines.iter().position(|l| *l == kill).unwrap_or_else(|| panic!("no line {kill:?}\n{stdout}"));
    for (i, line) in lines[at + 2..at + 8].iter().enumerate() {
        assert!(line.starts_with(&format!("   call {} -> {tr_fr}", i + 1)), "{line}");
    }
    assert!(lines[at + 8].starts_with("   6/6 succeeded, "), "{}", lines[at + 8]);
    assert!(
        lines.iter().any(|l| l.starts_with(
            "Summary: calls by capability (least_loaded, then round_robin 4/4 by policy), tags honoured, a 3-agent \
             chain, a helpful NOT_FOUND, and no failed call after a kill. Done in "
        )),
        "{stdout}"
    );
}
