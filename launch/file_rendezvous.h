// The file rendezvous: for jobs without a reachable rank 0 address, through
// a file on a filesystem every rank sees (ZEST_RENDEZVOUS_FILE).
//
// Rank 0 writes the blob with the world size, the job id and a fresh random
// nonce to `path`.tmp.*, fsyncs it and renames it to `path` (a rename is
// atomic, so a reader sees a whole file or none). Every other rank polls
// until a file of its own job is there, takes the blob and acknowledges with
// `path`.ack<rank> carrying the nonce. Rank 0 waits for every acknowledgement
// and then removes them and the file.
//
// Stale files. A run that failed half-way can leave its file behind, and the
// next run's ranks must not take it. The rule:
//   - rank 0 removes `path` and any `path`.ack* before writing its own file;
//   - a rank takes a file only if its world size and job id are its own, so
//     with a job id (from torchrun, Slurm, Open MPI or ZEST_JOB_ID) an old
//     file is never taken, whenever it is seen;
//   - without a job id, a rank that starts before rank 0 has removed the old
//     file may take it. Its acknowledgement then carries the old nonce, and
//     rank 0 fails with an error naming that rank. Set ZEST_JOB_ID, or use a
//     fresh path per run (or delete the file before launching), to rule this
//     out.
// Shared filesystems may show a new file to other hosts only after their
// attribute cache expires (NFS: up to a minute), so give the rendezvous a
// timeout longer than that.
#pragma once

#include <string>
#include <string_view>

#include "zest/launch/rendezvous.h"

namespace zest {

// Rank 0 publishes `blob`; the others wait for it. Returns the blob on every
// rank. The directory of `path` must exist on every rank.
std::string file_rendezvous(const std::string& path, const RendezvousMember& me,
                            std::string_view blob);

}  // namespace zest
