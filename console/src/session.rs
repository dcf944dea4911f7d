//! Sign-in and sessions. A person signs in with a PostgreSQL role and its password; the
//! console connects as that role and keeps the connection for the session, so every page is
//! read, and every action taken, by PostgreSQL as that role: row-level security and pg_tide's
//! grants decide what it sees and may do. The password stays in the console's memory (to
//! reconnect after a server restart) and is never written anywhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::Stream;
use rand::RngCore;
use tokio_postgres::{AsyncMessage, Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// What a live page's connection says (its notifications), until the server closes it.
pub type Messages =
    std::pin::Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// A session ends after this long without a request.
pub const IDLE: Duration = Duration::from_secs(8 * 3600);
/// The most sessions kept at once (the oldest idle one goes first).
const MAX_SESSIONS: usize = 1000;

pub struct Session {
    pub user: String,
    password: String,
    /// The token every form of this session carries (compared on every POST).
    pub csrf: String,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    last_seen: Mutex<Instant>,
    /// Live pages of this session open now (each holds a PostgreSQL connection).
    pub streams: std::sync::atomic::AtomicUsize,
}

pub struct Sessions {
    base: Config,
    tls: MakeRustlsConnect,
    read_only: bool,
    map: Mutex<HashMap<String, Arc<Session>>>,
}

/// 32 random bytes in hex: session ids and CSRF tokens.
pub fn token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Compares two tokens in time independent of where they differ.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Sessions {
    pub fn new(base: Config, tls: MakeRustlsConnect, read_only: bool) -> Sessions {
        Sessions {
            base,
            tls,
            read_only,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The connection settings for a role: the console's database, as that role. In read-only
    /// mode every transaction is read-only, a second guard behind the hidden buttons.
    fn config(&self, user: &str, password: &str) -> Config {
        let mut c = self.base.clone();
        c.user(user)
            .password(password)
            .application_name("pg_tide-console")
            .connect_timeout(Duration::from_secs(10));
        let mut options = String::from("-c TimeZone=UTC -c statement_timeout=30s");
        if self.read_only {
            options.push_str(" -c default_transaction_read_only=on");
        }
        c.options(&options);
        c
    }

    pub async fn connect(
        &self,
        user: &str,
        password: &str,
    ) -> Result<Client, tokio_postgres::Error> {
        let (client, conn) = self
            .config(user, password)
            .connect(self.tls.clone())
            .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    /// Signs in: the role and password are good when PostgreSQL accepts a connection with
    /// them. Returns the new session's id.
    pub async fn sign_in(
        &self,
        user: &str,
        password: &str,
    ) -> Result<String, tokio_postgres::Error> {
        let client = self.connect(user, password).await?;
        let id = token();
        let s = Arc::new(Session {
            user: user.to_string(),
            password: password.to_string(),
            csrf: token(),
            client: tokio::sync::Mutex::new(Some(Arc::new(client))),
            last_seen: Mutex::new(Instant::now()),
            streams: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut map = self.map.lock().unwrap();
        map.retain(|_, s| s.idle() < IDLE);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .max_by_key(|(_, s)| s.idle())
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), s);
        Ok(id)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = self.map.lock().unwrap();
        let s = map.get(id)?.clone();
        if s.idle() >= IDLE {
            map.remove(id);
            return None;
        }
        *s.last_seen.lock().unwrap() = Instant::now();
        Some(s)
    }

    pub fn sign_out(&self, id: &str) {
        self.map.lock().unwrap().remove(id);
    }

    /// The session's connection, reconnected when the server closed it (a restart).
    pub async fn client(&self, s: &Session) -> Result<Arc<Client>, tokio_postgres::Error> {
        let mut slot = s.client.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(self.connect(&s.user, &s.password).await?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// A second connection as the session's role, for a live page's LISTEN: the client and
    /// the stream of what the server sends on it (which drives the connection).
    pub async fn listener(&self, s: &Session) -> Result<(Client, Messages), tokio_postgres::Error> {
        let (client, mut conn) = self
            .config(&s.user, &s.password)
            .connect(self.tls.clone())
            .await?;
        let messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        Ok((client, Box::pin(messages)))
    }
}

impl Session {
    fn idle(&self) -> Duration {
        self.last_seen.lock().unwrap().elapsed()
    }
}

/// The value of one cookie in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (token(), token());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(same_token(&a, &a.clone()));
        assert!(!same_token(&a, &b));
        assert!(!same_token(&a, &a[..63]));
    }

    #[test]
    fn finds_a_cookie() {
        let h = "a=1; tide_session=abc; b=2";
        assert_eq!(cookie(h, "tide_session"), Some("abc"));
        assert_eq!(cookie(h, "tide"), None);
        assert_eq!(cookie("", "tide_session"), None);
    }
}
