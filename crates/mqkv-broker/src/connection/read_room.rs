//! How much room a connection's read buffer gets.

use bytes::BytesMut;

/// How much room a connection's read buffer gets. Decoded packets split their bytes off the
/// front of the buffer, so its spare room shrinks; it is given a chunk of room back once less
/// than a quarter of a chunk is left, so a read never fetches only a few dozen bytes.
///
/// The chunk starts small: most connections of a broker send little (a device that publishes
/// now and then, a subscriber's acknowledgements), and an idle connection keeps its buffer, so
/// its size is most of what an idle connection costs. A read that fills all the room it had
/// doubles the chunk, and a connection that has sent [`ReadRoom::MAX`] bytes gets the largest
/// chunk, so a busy connection reads in large chunks and takes new room seldom (a request's
/// bytes stay shared with the buffer while its work is under way, so new room is often a new
/// allocation); a connection found idle by its keep alive check starts small again.
#[derive(Debug)]
pub(super) struct ReadRoom {
    chunk: usize,
    /// Bytes read since the connection began or was last found idle, counted up to
    /// [`ReadRoom::MAX`].
    read: usize,
}

impl ReadRoom {
    pub(super) const MIN: usize = 1024;
    pub(super) const MAX: usize = 8 * 1024;

    pub(super) fn new() -> ReadRoom {
        ReadRoom {
            chunk: Self::MIN,
            read: 0,
        }
    }

    /// Gives `buf` a chunk of room once less than a quarter of one is left; returns the room
    /// the next read has.
    pub(super) fn make(&self, buf: &mut BytesMut) -> usize {
        if buf.capacity() - buf.len() < self.chunk / 4 {
            buf.reserve(self.chunk);
        }
        buf.capacity() - buf.len()
    }

    /// Notes a read of `n` bytes into `room` bytes of room: one that filled it doubles the
    /// chunk, and so does reading the largest chunk's worth in all.
    pub(super) fn read(&mut self, n: usize, room: usize) {
        self.read = (self.read + n).min(Self::MAX);
        if self.read >= Self::MAX {
            self.chunk = Self::MAX;
        } else if n >= room {
            self.chunk = (self.chunk * 2).min(Self::MAX);
        }
    }

    /// An idle connection: an empty buffer that grew is given back, and the chunk starts small
    /// again.
    pub(super) fn idle(&mut self, buf: &mut BytesMut) {
        if buf.is_empty() && buf.capacity() > Self::MIN {
            *buf = BytesMut::with_capacity(Self::MIN);
        }
        *self = ReadRoom::new();
    }
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};

    use super::ReadRoom;

    #[test]
    fn a_read_room_grows_with_what_the_connection_sends_and_shrinks_when_idle() {
        let mut room = ReadRoom::new();
        let mut buf = BytesMut::new();
        // A new connection gets the small chunk.
        let r = room.make(&mut buf);
        assert!((ReadRoom::MIN..2 * ReadRoom::MIN).contains(&r), "{r}");
        // Reads that leave room change nothing until the largest chunk's worth has come.
        room.read(100, r);
        assert_eq!(room.chunk, ReadRoom::MIN);
        // A read that filled its room doubles the chunk, up to the largest.
        room.read(r, r);
        assert_eq!(room.chunk, 2 * ReadRoom::MIN);
        for _ in 0..10 {
            room.read(1, 1);
        }
        assert_eq!(room.chunk, ReadRoom::MAX);
        buf.put_bytes(0, 10);
        let r = room.make(&mut buf);
        assert!(r >= ReadRoom::MAX, "{r}");
        // Idle with bytes of a packet still buffered: the buffer is kept, the chunk starts over.
        room.idle(&mut buf);
        assert_eq!((buf.len(), room.chunk), (10, ReadRoom::MIN));
        // Idle and empty: a grown buffer is given back.
        buf.clear();
        room.idle(&mut buf);
        assert!(buf.capacity() <= ReadRoom::MIN, "{}", buf.capacity());
        // Small reads add up: the largest chunk's worth in all grows the chunk to the largest.
        let mut room = ReadRoom::new();
        for _ in 0..ReadRoom::MAX / 100 {
            room.read(100, 1000);
        }
        assert_eq!(room.chunk, ReadRoom::MIN);
        room.read(100, 1000);
        assert_eq!(room.chunk, ReadRoom::MAX);
    }
}
