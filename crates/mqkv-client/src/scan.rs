//! SCAN as a lazy pager.
//!
//! Invariant: after the server returns a page without a continuation token
//! the pager sends nothing more; a failed request leaves the token as it
//! was, so calling [`KeyPager::next_page`] again retries the same page.

use bytes::Bytes;

use crate::client::Client;
use crate::error::Result;

/// Pages of keys matching a pattern; from [`Client::scan`]. Nothing is sent
/// until the first [`KeyPager::next_page`].
#[derive(Debug)]
pub struct KeyPager {
    client: Client,
    pattern: Bytes,
    token: Option<Bytes>,
    done: bool,
}

impl KeyPager {
    pub(crate) fn new(client: Client, pattern: Bytes) -> KeyPager {
        KeyPager {
            client,
            pattern,
            token: None,
            done: false,
        }
    }

    /// The next page of keys, or `None` when the scan is complete. Pages
    /// may be empty while more follow.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut pager = client.scan("*");
    /// let mut count = 0;
    /// while let Some(page) = pager.next_page().await? {
    ///     count += page.len();
    /// }
    /// println!("{count} keys");
    /// # Ok(()) }
    /// ```
    pub async fn next_page(&mut self) -> Result<Option<Vec<Bytes>>> {
        if self.done {
            return Ok(None);
        }
        let (keys, token) = self
            .client
            .scan_page(&self.pattern, self.token.as_ref())
            .await?;
        self.done = token.is_none();
        self.token = token;
        Ok(Some(keys))
    }

    /// Fetches every remaining page and returns all keys.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let keys = client.scan("sensor/*").collect().await?;
    /// # Ok(()) }
    /// ```
    pub async fn collect(mut self) -> Result<Vec<Bytes>> {
        let mut all = Vec::new();
        while let Some(page) = self.next_page().await? {
            all.extend(page);
        }
        Ok(all)
    }
}
