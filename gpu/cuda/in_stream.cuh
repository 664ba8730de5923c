#pragma once
// In-stream all-reduce (collective_algo::in_stream, graph/plan.hpp): each
// member's part is one kernel on its compute stream that meets the other
// members' parts on the devices, so a job's stream runs through its
// collectives without the host, inside a replayed graph too. Only gpu/cuda/
// includes it.
//
// How the parts meet. Every logical device owns an in_stream_area: flag
// words in device memory that its peers write (arrive: one per block and
// sending device); each compute stream owns a tag word that it sets before
// the job's parts run (cuda_device::set_collective_tag: the job's id). The
// tag is per stream: with one word per device (until 2026-11-28), a part of
// one job on lane 0 could read the tag that lane 1 set for another job, and
// then look for lines its peer never pushed. A part with tag T (the
// job id shifted left 20 bits, or the collective's key) runs block b of the
// same grid on every member: after its stream's previous kernel (its operand
// is written), each block announces T in every peer's arrive[b][my slot]
// (release, system scope) and waits until every peer announced T in its
// own; then it sums slice b of every member's operand (read in place, over
// NVLink or, for two logical devices of one GPU, directly) into its output.
// Each member acknowledges the announcement it saw (ack, in the sender's
// area), and a sender overwrites its announcement to a peer only once the
// peer acknowledged the previous one (in steady state long before).
// There is no barrier at the end: a stream overwrites an operand only after
// a step the plan orders after every member's part (the memory plan's
// happens-before; a later collective's arrival barrier or the job's end
// meets that order), so the readers are done by then.
// Flags hold tags, compared for equality: parts of different jobs or
// collectives never pair, whatever ran before. A wait gives up when the
// member's device died (its host-mapped dead word), when this device was
// told the job was cancelled (abort ring), or after the timeout; the part
// then records the job in its device's fault ring (host-mapped), which the
// runtime reads before the job completes (device::collective_fault).
//
// Small parts push instead (at most in_stream_push_max_bytes of 16-byte
// words, the decode step's all-reduces): a reader then waits for one
// crossing of NVLink, not an announcement plus a round trip to read. Each
// member's block b writes its slice of its operand into every peer's inbox
// as 16-byte lines {4 data bytes, flag, 4 data bytes, flag}, the flag a
// nonzero 32-bit hash of the tag, with single 16-byte stores whose 8-byte
// halves land whole; no announcement, no fence. A reader takes a line when
// both flags match its tag's, then clears it. A sender alternates between
// two inboxes (parities) per peer and block, and the reader looks in both:
// a sender's next push into a parity follows the peer's push of the
// collective between, which the peer makes only after its part of the one
// before (that read and cleared the parity) completed, so no line is
// overwritten before it is read. That holds per line only because a word
// always travels through the same block, whatever the part's size: a pushed
// part's block b carries words [b W, (b + 1) W), W =
// in_stream_push_block_words (in_stream_split). (Until 2026-11-28 blocks
// split each part evenly, so parts of different sizes sent a word through
// different blocks, whose parities need not alternate: a sender one part
// ahead could overwrite lines its peer had not read yet. Found by review.)
// A part that gives up leaves its peers' lines uncleared with its own flag,
// which no later part looks for (a stale line could only be taken on a
// 32-bit hash collision of two tags of the same pair); the runtime's same-order rule (collective_order.hpp) is
// what makes "the collective between" well defined.
// The kernel releases its dependents early (pdl_release: the next kernel's
// blocks launch, load their first weights and wait for this grid) only
// where every member is a GPU of its own: where members share a GPU
// (logical devices), blocks of the next kernel waiting on an SM could keep
// another member's part from arriving.

#include <array>
#include <cstdint>

#include "gpu/cuda/in_stream_split.hpp"
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

constexpr int in_stream_slots = 64;       ///< sending devices per flag array (the runtime's device index)
constexpr int in_stream_aborts = 8;       ///< abort ring: recently cancelled jobs
constexpr int in_stream_faults = 16;      ///< fault ring: jobs whose parts gave up
constexpr int in_stream_fault_detail = 4; ///< after the ring: the last give-up's wanted tag, seen word, peer/block, previous tag (or, top bit set, the pushed lines' flag)
constexpr int in_stream_progress = 2;     ///< after the detail: the tag of the last part whose block 0 started here, and finished
constexpr int in_stream_members_max = 8;  ///< == ag::max_in_stream_members
constexpr int in_stream_key_bits = 20;    ///< tag = job << key_bits | key
/// 16-byte lines of one inbox (a sender's, one parity): 8 data bytes each.
constexpr int64_t in_stream_inbox_lines = in_stream_push_max_bytes / 8;

/// One logical device's in-stream memory (made by cuda_device, freed with it).
struct in_stream_area {
  unsigned long long* arrive = nullptr;  ///< device: [in_stream_blocks][in_stream_slots]
  unsigned long long* ack = nullptr;     ///< device: same shape, what each sender saw of this one's
  unsigned long long* last = nullptr;    ///< device: same shape, this one's last announcement to each
  /// device: [in_stream_slots][2][in_stream_inbox_lines] 16-byte lines, the
  /// pushes of each sender (by its slot) into this device, two parities
  unsigned int* inbox = nullptr;
  unsigned long long* push_parity = nullptr;  ///< device: [blocks][slots], the parity of this one's next push to each
  // Job ids are stored as id + 1 (in_stream_job_word): zero means none.
  unsigned long long* aborted_host = nullptr;  ///< mapped: [in_stream_aborts] cancelled jobs
  unsigned long long* aborted_dev = nullptr;
  unsigned long long* faults_host = nullptr;   ///< mapped: [in_stream_faults], slot w % n holds word w
  unsigned long long* faults_dev = nullptr;
  /// device: [in_stream_progress], what this device's GPU last did (for a
  /// give-up's report: which member never started the part, or is stuck in
  /// which earlier one); the host copies it into progress_host (pinned) to
  /// read it. Not host-mapped: the parts' writes would delay their grids' end.
  unsigned long long* progress_dev = nullptr;
  unsigned long long* progress_host = nullptr;
  const unsigned int* dead_dev = nullptr;      ///< mapped: its device core's death word (nonzero: dead)
  /// device: a tensor-parallel decode step's exchange (decode_step.cuh,
  /// decode_exchange_bytes): what the step's ranks push into this device.
  void* decode_exchange = nullptr;
  int slot = 0;                                ///< its runtime device index (< in_stream_slots)
};

/// How a job id is stored in the tag word and the rings.
constexpr unsigned long long in_stream_job_word(uint64_t job) { return job + 1; }

/// One member of a part as this member's kernel sees it.
struct in_stream_member {
  const void* operand = nullptr;  ///< in that member's memory
  const in_stream_area* area = nullptr;
};

/// Enqueues this member's part on c.stream: out = the sum of every member's
/// operand (f32 accumulation; i32 exact, saturated), members in rank order,
/// `mine` this device's area, `tag_word` the stream's job tag (set by
/// launch_set_in_stream_tag on the same stream). All members launch the
/// same grid (it depends on the element count only). `release_early`:
/// every member is a GPU of its own (see above).
error launch_in_stream_all_reduce(const launch_ctx& c, const tensor_arg& out, const in_stream_member* members, int n,
                                  int rank, const in_stream_area& mine, const unsigned long long* tag_word,
                                  uint32_t key, double timeout_s, bool release_early);

/// Enqueues the job tag for the parts that follow on c.stream, in that
/// stream's tag word (one per stream: parts of other jobs on another stream
/// of the device have their own).
error launch_set_in_stream_tag(const launch_ctx& c, unsigned long long* tag_word, uint64_t job);

}  // namespace ag::gpu::cuda
