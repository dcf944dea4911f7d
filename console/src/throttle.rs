//! Sign-in throttling: after `limit` failed sign-ins in a row for a role, or from an address,
//! further attempts for it are refused at once, without asking PostgreSQL, until `pause` has
//! passed; a success clears the role's and the address's count. Kept in memory (a restart
//! forgets it), at most `MAX_KEYS` roles and addresses (the oldest forgotten first).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MAX_KEYS: usize = 10_000;

#[derive(Clone, Copy)]
struct Count {
    failures: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

pub struct Throttle {
    limit: u32,
    pause: Duration,
    map: Mutex<HashMap<String, Count>>,
}

/// Why a sign-in is refused before it is tried: what is throttled and for how long still.
pub struct Refused {
    pub what: String,
    pub wait: Duration,
}

impl Throttle {
    pub fn new(limit: u32, pause: Duration) -> Throttle {
        Throttle {
            limit: limit.max(1),
            pause,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn keys(role: &str, addr: &str) -> [(String, String); 2] {
        [
            (format!("role {role}"), format!("role {role:?}")),
            (format!("addr {addr}"), format!("your address ({addr})")),
        ]
    }

    /// Whether a sign-in of `role` from `addr` may be tried now.
    pub fn check(&self, role: &str, addr: &str, now: Instant) -> Result<(), Refused> {
        let mut map = self.map.lock().unwrap();
        for (key, what) in Self::keys(role, addr) {
            if let Some(c) = map.get_mut(&key) {
                match c.blocked_until {
                    Some(until) if until > now => {
                        return Err(Refused {
                            what,
                            wait: until - now,
                        })
                    }
                    // The pause is over: a fresh count.
                    Some(_) => {
                        *c = Count {
                            failures: 0,
                            last: now,
                            blocked_until: None,
                        }
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }

    /// A failed sign-in: counted for the role and the address.
    pub fn failed(&self, role: &str, addr: &str, now: Instant) {
        let mut map = self.map.lock().unwrap();
        if map.len() >= MAX_KEYS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, c)| c.last)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        for (key, _) in Self::keys(role, addr) {
            let c = map.entry(key).or_insert(Count {
                failures: 0,
                last: now,
                blocked_until: None,
            });
            c.failures += 1;
            c.last = now;
            if c.failures >= self.limit {
                c.blocked_until = Some(now + self.pause);
            }
        }
    }

    /// A successful sign-in clears the role's and the address's count.
    pub fn succeeded(&self, role: &str, addr: &str) {
        let mut map = self.map.lock().unwrap();
        for (key, _) in Self::keys(role, addr) {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eleventh_attempt_waits_for_the_pause() {
        let t = Throttle::new(10, Duration::from_secs(30));
        let start = Instant::now();
        for _ in 0..10 {
            assert!(t.check("alice", "10.0.0.1", start).is_ok());
            t.failed("alice", "10.0.0.1", start);
        }
        let r = t.check("alice", "10.0.0.1", start).expect_err("refused");
        assert_eq!(r.what, "role \"alice\"");
        assert_eq!(r.wait, Duration::from_secs(30));
        // The same address for another role: refused too (the address's count).
        assert!(t.check("bob", "10.0.0.1", start).is_err());
        // Another address for another role: tried.
        assert!(t.check("bob", "10.0.0.2", start).is_ok());
        // After the pause, a fresh count; a success clears it.
        let later = start + Duration::from_secs(31);
        assert!(t.check("alice", "10.0.0.1", later).is_ok());
        t.failed("alice", "10.0.0.1", later);
        t.succeeded("alice", "10.0.0.1");
        assert!(t.map.lock().unwrap().is_empty());
    }
}
