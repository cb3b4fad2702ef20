//! A network partition between kafka-delay's instances and one broker: iptables rules that
//! drop every packet to and from the broker's listener for the instances, so their
//! connections hear nothing (as a partition drops packets) while the brokers and the test's
//! own clients still reach it. The rules are made only inside a network namespace of the
//! test's own (`scripts/test.sh` runs the secured suite in one), never on the machine's.
#![allow(dead_code)]

use std::process::Command;

/// The packets of one port on 127.0.0.1, dropped while cut.
pub(crate) struct Partition {
    port: u16,
    cut: bool,
}

impl Partition {
    /// A partition of `port`, healed. Panics, saying how to run the test, outside a network
    /// namespace of the test's own.
    pub(crate) fn new(port: u16) -> Self {
        own_namespace().unwrap_or_else(|why| {
            panic!(
                "a network partition is made with iptables, only inside a network namespace of \
                 the test's own ({why}): run `bash scripts/test.sh quiet`, or as root \
                 `KAFKA_DELAY_TEST_NETNS=1 unshare --net sh -c 'ip link set lo up && exec cargo test ...'`"
            )
        });
        Partition { port, cut: false }
    }

    /// Cuts (`true`) or heals (`false`): packets to the port and from it dropped, or let through.
    pub(crate) fn cut(&mut self, cut: bool) {
        if cut == self.cut {
            return;
        }
        let action = if cut { "-I" } else { "-D" };
        for way in ["--dport", "--sport"] {
            let port = self.port.to_string();
            let args = ["-w", action, "INPUT", "-p", "tcp", way, &port, "-j", "DROP"];
            let out = Command::new("iptables")
                .args(args)
                .output()
                .expect("iptables (Debian's iptables package; `make deps` installs it)");
            assert!(
                out.status.success(),
                "iptables {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.cut = cut;
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if self.cut && !std::thread::panicking() {
            self.cut(false);
        }
    }
}

/// Whether this process runs in a network namespace made for it: KAFKA_DELAY_TEST_NETNS set
/// by whoever made it, and no network interface but loopback.
fn own_namespace() -> Result<(), String> {
    if std::env::var_os("KAFKA_DELAY_TEST_NETNS").is_none() {
        return Err("KAFKA_DELAY_TEST_NETNS is not set".into());
    }
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    let links = String::from_utf8_lossy(&out.stdout);
    let others: Vec<&str> = links
        .lines()
        .filter_map(|l| l.split(':').nth(1).map(str::trim))
        .filter(|name| *name != "lo")
        .collect();
    if others.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "this namespace has interfaces other than lo: {others:?}"
        ))
    }
}
