//! The row events of one transaction, held as the binlog sent them (not decoded), in memory up
//! to a limit and in a temporary file beyond it; decoded only once the transaction's commit is
//! read, in chunks of whole row events.
//!
//! # Why raw
//!
//! A decoded row (a JSON map per image, with owned column names and values) takes 50-100 times
//! the bytes of the row image in the binlog: a 1,000,000-row `INSERT ... SELECT` of 20 MB of
//! binlog took 1.5 GB decoded. Held raw, the same transaction takes its 20 MB, and only one
//! chunk of it (a few thousand rows) is ever decoded at a time (invariant I6). Past
//! `source.transaction_memory_mb` the events go to a temporary file in `source.spill_dir`
//! (deleted when the transaction is dropped: applied, rolled back, or cut short by a
//! reconnect), so memory does not grow with the transaction at all.
//!
//! A rolled-back transaction or one whose connection was cut is dropped with its events; an
//! XA PREPARE'd one is held until its XA COMMIT (`binlog::xa`): nothing held here reaches
//! Redis before the transaction's commit is read.
//!
//! # Shape
//!
//! Each held event is the row event as mysql_common parsed it ([`Event`]), the
//! [`TableSchema`] of the TABLE_MAP it follows (shared, one per table per TABLE_MAP), and the
//! end position of the event it was read from (a TRANSACTION_PAYLOAD's for its inner events),
//! which decode errors name. In the spill file an event is stored as
//! `[schema index: u32 LE][end position: u32 LE][length: u32 LE][event header][event data]`: the
//! data without a checksum (mysql_common strips it when reading; the CRC was checked then), the
//! header's size field set to match, read back with the format description of the first
//! spilled event (one transaction never spans two binlog files, so all its events share it)
//! and no checksum.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;

use mysql_common::binlog::events::{BinlogEventFooter, BinlogEventHeader, Event, EventData, FormatDescriptionEvent};
use mysql_common::proto::MySerialize;

use crate::binlog::decode::{decode_rows, DecodeError, RowChange, TableSchema};

/// Where and when the row events of an open transaction are spilled.
#[derive(Debug, Clone)]
pub struct SpillSettings {
    /// Bytes of row events held in memory per transaction before the rest goes to a file
    /// (`source.transaction_memory_mb`).
    pub memory_bytes: usize,
    /// Folder of the temporary files (`source.spill_dir`; default: the system's temp dir).
    pub dir: Option<PathBuf>,
}

impl Default for SpillSettings {
    fn default() -> Self {
        SpillSettings { memory_bytes: 32 << 20, dir: None }
    }
}

/// A held row event: the event, its table (index into [`RowEvents::schemas`]), and the end
/// position of the event it was read from.
#[derive(Debug)]
struct Held {
    schema: u32,
    end_pos: u32,
    event: Event,
}

/// The events of a transaction that went to the spill file.
#[derive(Debug)]
struct Spill {
    file: BufWriter<std::fs::File>,
    fde: FormatDescriptionEvent<'static>,
    events: u64,
    bytes: u64,
}

impl Spill {
    /// A new spill file in `settings.dir`, read back with the format description of `first`.
    fn create(first: &Event, settings: &SpillSettings) -> std::io::Result<Spill> {
        let f = match &settings.dir {
            Some(d) => tempfile::tempfile_in(d),
            None => tempfile::tempfile(),
        }?;
        // No checksum on the way back: the data is stored without one.
        let fde = first.fde().clone().with_footer(BinlogEventFooter::default());
        Ok(Spill { file: BufWriter::with_capacity(1 << 16, f), fde, events: 0, bytes: 0 })
    }

    /// Append one event (module docs: the record layout).
    fn write(&mut self, schema: u32, end_pos: u32, event: &Event) -> std::io::Result<()> {
        let size = event.data().len();
        let mut header = Vec::with_capacity(BinlogEventHeader::LEN);
        event.header().serialize(&mut header);
        let len = BinlogEventHeader::LEN + size;
        header[9..13].copy_from_slice(&(len as u32).to_le_bytes());
        let head = [schema.to_le_bytes(), end_pos.to_le_bytes(), (len as u32).to_le_bytes()].concat();
        self.file.write_all(&head)?;
        self.file.write_all(&header)?;
        self.file.write_all(event.data())?;
        self.events += 1;
        self.bytes += size as u64;
        Ok(())
    }
}

/// The spill folder as errors name it.
fn spill_dir_text(settings: &SpillSettings) -> String {
    settings.dir.as_ref().map_or_else(|| std::env::temp_dir().display().to_string(), |d| d.display().to_string())
}

/// The row events of mapped tables of one transaction, in binlog order (see the module docs).
#[derive(Debug, Default)]
pub struct RowEvents {
    /// The binlog file the transaction is in (decode errors name `file:pos`).
    file: String,
    schemas: Vec<Arc<TableSchema>>,
    memory: Vec<Held>,
    memory_bytes: usize,
    spill: Option<Spill>,
}

/// Why held row events could not be decoded: the row image did not decode
/// ([`DecodeError`], at `position`), or the spill file could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum RowEventsError {
    /// A row event did not decode.
    #[error("at {position}: {source}")]
    Decode {
        /// `file:pos` of the event.
        position: String,
        /// What was wrong.
        #[source]
        source: DecodeError,
    },
    /// The temporary file of a large transaction failed.
    #[error("spill file of a large transaction ({dir}): {source}")]
    Spill {
        /// The folder of the file.
        dir: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl RowEvents {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when no row event is held.
    pub fn is_empty(&self) -> bool {
        self.events() == 0
    }

    /// Row events held (in memory and spilled).
    pub fn events(&self) -> u64 {
        self.memory.len() as u64 + self.spill.as_ref().map_or(0, |s| s.events)
    }

    /// Bytes of row-event data held in memory.
    pub fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    /// Bytes of row-event data held in all (memory and spill file).
    pub fn total_bytes(&self) -> u64 {
        self.memory_bytes as u64 + self.spill.as_ref().map_or(0, |s| s.bytes)
    }

    /// True when some events went to the spill file.
    pub fn spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Hold one row event of `schema`'s table, read in binlog file `file` from the event ending
    /// at `end_pos`. Past `settings.memory_bytes` in memory, the event goes to the spill file.
    ///
    /// Errors: the spill file cannot be created or written ([`RowEventsError::Spill`]).
    pub fn push(
        &mut self,
        schema: &Arc<TableSchema>,
        file: &str,
        end_pos: u32,
        event: Event,
        settings: &SpillSettings,
    ) -> Result<(), RowEventsError> {
        if self.file != file {
            self.file = file.to_string();
        }
        let schema = match self.schemas.iter().rposition(|s| Arc::ptr_eq(s, schema)) {
            Some(i) => i as u32,
            None => {
                self.schemas.push(schema.clone());
                (self.schemas.len() - 1) as u32
            }
        };
        let size = event.data().len();
        if self.spill.is_none() && self.memory_bytes + size <= settings.memory_bytes {
            self.memory_bytes += size;
            self.memory.push(Held { schema, end_pos, event });
            return Ok(());
        }
        let spill_err = |source| RowEventsError::Spill { dir: spill_dir_text(settings), source };
        if self.spill.is_none() {
            self.spill = Some(Spill::create(&event, settings).map_err(spill_err)?);
        }
        self.spill.as_mut().expect("just created").write(schema, end_pos, &event).map_err(spill_err)
    }

    /// Move every event held in memory to the spill file (before those already there): a
    /// prepared XA transaction waiting for its XA COMMIT keeps no memory (see `binlog::xa`).
    ///
    /// Errors: the spill file cannot be created or written ([`RowEventsError::Spill`]).
    pub fn move_to_disk(&mut self, settings: &SpillSettings) -> Result<(), RowEventsError> {
        let Some(first) = self.memory.first() else { return Ok(()) };
        let spill_err = |source| RowEventsError::Spill { dir: spill_dir_text(settings), source };
        let mut s = Spill::create(&first.event, settings).map_err(spill_err)?;
        for h in &self.memory {
            s.write(h.schema, h.end_pos, &h.event).map_err(spill_err)?;
        }
        if let Some(mut old) = self.spill.take() {
            // Events spilled before come after the ones that were in memory.
            let copy = (|| -> std::io::Result<()> {
                old.file.flush()?;
                let mut f = old.file.get_ref().try_clone()?;
                f.seek(SeekFrom::Start(0))?;
                std::io::copy(&mut f, &mut s.file)?;
                Ok(())
            })();
            copy.map_err(spill_err)?;
            s.events += old.events;
            s.bytes += old.bytes;
        }
        self.memory.clear();
        self.memory_bytes = 0;
        self.spill = Some(s);
        Ok(())
    }

    /// Decode every held row, in binlog order, in chunks: `f` is called with the rows of whole
    /// row events, at least `chunk_rows` of them per call except the last (a row event is never
    /// split: its rows are one statement's and take effect together). `RowChange::event`
    /// numbers the row events of the transaction from 0. Can be called more than once (a
    /// large transaction is read twice, see `write::apply`).
    ///
    /// Errors: a row event that does not decode (naming its position), a spill file that cannot
    /// be read back, or an error of `f` (returned as is).
    pub fn decode_chunks<E: From<RowEventsError>>(
        &mut self,
        chunk_rows: usize,
        mut f: impl FnMut(&mut Vec<RowChange>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut rows: Vec<RowChange> = Vec::with_capacity(chunk_rows.min(1 << 16));
        let mut index: u32 = 0;
        for h in &self.memory {
            decode_one(&self.schemas, &self.file, h.schema, h.end_pos, &h.event, index, &mut rows)?;
            index += 1;
            if rows.len() >= chunk_rows {
                f(&mut rows)?;
                rows.clear();
            }
        }
        if let Some(s) = &mut self.spill {
            let spill_err = |source| RowEventsError::Spill { dir: "spill file".into(), source };
            s.file.flush().map_err(spill_err)?;
            let mut file = s.file.get_ref().try_clone().map_err(spill_err)?;
            file.seek(SeekFrom::Start(0)).map_err(spill_err)?;
            let mut r = BufReader::with_capacity(1 << 16, file);
            let mut buf = Vec::new();
            for _ in 0..s.events {
                let mut head = [0u8; 12];
                r.read_exact(&mut head).map_err(spill_err)?;
                let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
                let (schema, end_pos, len) = (word(0), word(4), word(8) as usize);
                buf.resize(len, 0);
                r.read_exact(&mut buf).map_err(spill_err)?;
                let event = read_event(&s.fde, &buf).map_err(spill_err)?;
                decode_one(&self.schemas, &self.file, schema, end_pos, &event, index, &mut rows)?;
                index += 1;
                if rows.len() >= chunk_rows {
                    f(&mut rows)?;
                    rows.clear();
                }
            }
            // Appending may go on only before the first read; keep the writer at the end anyway.
            s.file.seek(SeekFrom::End(0)).map_err(spill_err)?;
        }
        if !rows.is_empty() {
            f(&mut rows)?;
        }
        Ok(())
    }

    /// Decode every held row into `out` (a transaction small enough to be applied at once).
    pub fn decode_all(&mut self, out: &mut Vec<RowChange>) -> Result<(), RowEventsError> {
        self.decode_chunks(usize::MAX, |rows| {
            out.append(rows);
            Ok::<(), RowEventsError>(())
        })
    }
}

/// An event as [`RowEvents::push`] spilled it, read back. mysql_common's `Event::read` panics on a
/// short input: the length is checked against the event's own header first.
fn read_event(fde: &FormatDescriptionEvent<'static>, bytes: &[u8]) -> std::io::Result<Event> {
    let size = bytes.get(9..13).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if size != Some(bytes.len()) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "spilled event does not match its length"));
    }
    Event::read(fde, bytes)
}

/// Decode the rows of one held event into `out`, numbering them with event index `index`.
fn decode_one(
    schemas: &[Arc<TableSchema>],
    file: &str,
    schema: u32,
    end_pos: u32,
    event: &Event,
    index: u32,
    out: &mut Vec<RowChange>,
) -> Result<(), RowEventsError> {
    let at = |source| RowEventsError::Decode { position: format!("{file}:{end_pos}"), source };
    let table = &schemas[schema as usize];
    let data = event.read_data().map_err(|e| at(DecodeError::Parse { table: table.name.to_string(), source: e }))?;
    let Some(EventData::RowsEvent(rows)) = data else {
        return Err(at(DecodeError::Parse {
            table: table.name.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "held event is not a row event"),
        }));
    };
    let first = out.len();
    decode_rows(table, &rows, out).map_err(at)?;
    for r in &mut out[first..] {
        r.event = index;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mysql_common::binlog::consts::BinlogVersion;
    use mysql_common::binlog::BinlogFile;

    /// The first table's prepared schema and all of its row events from a real MySQL binlog
    /// (`../shared/binlogs/mysql-test/write-full-row.binlog`).
    pub(crate) fn sample_row_events() -> (Arc<TableSchema>, Vec<Event>) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/mysql-test/update-full-row.binlog");
        let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = BinlogFile::new(BinlogVersion::Version4, std::io::BufReader::new(f)).unwrap();
        let mut schema: Option<Arc<TableSchema>> = None;
        let mut events = Vec::new();
        for ev in file {
            let Ok(ev) = ev else { break };
            match ev.read_data() {
                Ok(Some(EventData::TableMapEvent(t))) if schema.is_none() => {
                    schema = Some(Arc::new(TableSchema::from_table_map_positional(t.into_owned(), false).unwrap()));
                }
                Ok(Some(EventData::RowsEvent(r))) if schema.as_ref().is_some_and(|s| s.tme.table_id() == r.table_id()) => {
                    drop(r);
                    events.push(ev);
                }
                _ => {}
            }
        }
        assert!(events.len() >= 2, "sample binlog has {} row events", events.len());
        (schema.unwrap(), events)
    }

    /// A decoded row: (row event number, before image, after image).
    type Decoded = (u32, Option<crate::binlog::decode::Row>, Option<crate::binlog::decode::Row>);

    fn decoded(r: &mut RowEvents, chunk: usize) -> Vec<Vec<Decoded>> {
        let mut chunks = Vec::new();
        r.decode_chunks(chunk, |rows| {
            chunks.push(rows.iter().map(|r| (r.event, r.before.clone(), r.after.clone())).collect());
            Ok::<(), RowEventsError>(())
        })
        .unwrap();
        chunks
    }

    #[test]
    fn spilled_events_decode_exactly_as_held_ones() {
        let (schema, events) = sample_row_events();
        let n = events.len();
        let mut in_memory = RowEvents::new();
        let mut spilled = RowEvents::new();
        let dir = tempfile::tempdir().unwrap();
        let tiny = SpillSettings { memory_bytes: events[0].data().len(), dir: Some(dir.path().to_path_buf()) };
        for e in &events {
            in_memory.push(&schema, "f.000001", 100, e.clone(), &SpillSettings::default()).unwrap();
        }
        for e in events {
            spilled.push(&schema, "f.000001", 100, e, &tiny).unwrap();
        }
        assert!(!in_memory.spilled() && spilled.spilled());
        assert_eq!((spilled.events(), spilled.memory_bytes()), (n as u64, tiny.memory_bytes));
        let all = decoded(&mut in_memory, usize::MAX);
        assert_eq!(all.len(), 1);
        assert_eq!(decoded(&mut spilled, usize::MAX), all, "spilled events decode to the same rows");
        // Twice (a large transaction is read twice), and in chunks of whole row events.
        assert_eq!(decoded(&mut spilled, usize::MAX), all);
        let chunks = decoded(&mut spilled, 1);
        assert_eq!(chunks.len(), n, "one row event per chunk");
        assert_eq!(chunks.concat(), all[0]);
        let numbers: Vec<u32> = all[0].iter().map(|r| r.0).collect();
        assert_eq!(numbers.first(), Some(&0));
        assert!(numbers.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1), "{numbers:?}");
    }

    #[test]
    fn a_spill_folder_that_does_not_exist_is_a_clear_error() {
        let (schema, events) = sample_row_events();
        let bad = SpillSettings { memory_bytes: 0, dir: Some("/nonexistent/binval-spill".into()) };
        let e = RowEvents::new().push(&schema, "f", 4, events.into_iter().next().unwrap(), &bad).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/binval-spill"), "{e}");
    }
}
