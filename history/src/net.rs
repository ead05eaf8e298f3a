//! Network partitions between the clients and PostgreSQL, made by the
//! harness itself (as root, with iproute2): a network namespace of its own
//! for the clients, a veth pair between it and the machine with two
//! addresses of the pair's own /30 (never any other address), and a TCP
//! relay on the machine's end that forwards to the server the store URL
//! names (the server itself listens on loopback only). A partition takes
//! the machine's end of the pair down: every client connection stalls as
//! on a cut cable (no reset, no error) until it is brought up again.
//!
//! Everything made is removed when the [`Net`] is dropped.

use crate::die;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::process::Command;

/// The namespace, the pair and the relay of one run.
pub struct Net {
    ns: String,
    host_if: String,
    relay: std::net::SocketAddr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (iproute2 is needed)", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// Make the namespace and the pair, and start the relay to the server
    /// of `url` (a `postgres://` URL).
    pub fn new(url: &str) -> Net {
        let id = std::process::id();
        // 10.231.X.Y/30 of our own, from the pid: runs side by side differ.
        let block = (id % 16_000) * 4;
        let (x, y) = (block / 256, block % 256);
        let (host_ip, ns_ip) = (
            format!("10.231.{x}.{}", y + 1),
            format!("10.231.{x}.{}", y + 2),
        );
        let mut net = Net {
            ns: format!("lhh-{id}"),
            host_if: format!("lhh{id}a"),
            relay: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let ns_if = format!("lhh{id}b");
        let made = (|| {
            ip(&["netns", "add", &net.ns])?;
            ip(&[
                "link",
                "add",
                &net.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &ns_if,
            ])?;
            ip(&["link", "set", &ns_if, "netns", &net.ns])?;
            ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &net.host_if])?;
            ip(&["link", "set", &net.host_if, "up"])?;
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &net.ns, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            inside(&["addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if])?;
            inside(&["link", "set", &ns_if, "up"])?;
            inside(&["link", "set", "lo", "up"])
        })();
        if let Err(e) = made {
            drop(net);
            die(&format!("--faults partition (as root): {e}"));
        }
        let target = server_of(url);
        let listener = TcpListener::bind(format!("{host_ip}:0"))
            .unwrap_or_else(|e| die(&format!("relay on {host_ip}: {e}")));
        net.relay = listener
            .local_addr()
            .unwrap_or_else(|e| die(&e.to_string()));
        std::thread::spawn(move || relay_all(listener, target));
        net
    }

    /// `url` with its server replaced by the relay.
    pub fn url_through_relay(&self, url: &str) -> String {
        let (head, _, tail) = split_url(url);
        format!("{head}{}{tail}", self.relay)
    }

    /// A command that runs `program` inside the clients' namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }

    /// Cut (`false`) or restore (`true`) the link.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        if let Err(e) = ip(&["link", "set", &self.host_if, state]) {
            die(&e);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// `url` as (what comes before the server, `host:port`, the rest).
fn split_url(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let start = url[start..]
        .find('@')
        .filter(|&at| !url[start..start + at].contains('/'))
        .map_or(start, |at| start + at + 1);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end], &url[end..])
}

/// The server a `postgres://` URL names (port 5432 if none).
fn server_of(url: &str) -> std::net::SocketAddr {
    let (_, host_port, _) = split_url(url);
    let with_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| die(&format!("--faults partition: no server in {url:?}")))
}

/// Forward every connection to `target`, both ways, until either side
/// closes.
fn relay_all(listener: TcpListener, target: std::net::SocketAddr) {
    for conn in listener.incoming().flatten() {
        let Ok(server) = TcpStream::connect(target) else {
            continue;
        };
        let (Ok(c2), Ok(s2)) = (conn.try_clone(), server.try_clone()) else {
            continue;
        };
        std::thread::spawn(move || pump(conn, server));
        std::thread::spawn(move || pump(s2, c2));
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn the_server_part_of_a_url() {
        for (url, server) in [
            ("postgres://postgres@127.0.0.1:5432/test", "127.0.0.1:5432"),
            ("postgres://127.0.0.1/test?sslmode=disable", "127.0.0.1"),
            ("postgres://u:p@db:6000", "db:6000"),
        ] {
            let (head, got, tail) = split_url(url);
            assert_eq!(got, server, "{url}");
            assert_eq!(format!("{head}{got}{tail}"), url);
        }
    }
}
