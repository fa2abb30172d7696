// The results as a report: what was run and what the numbers cover, a table
// of model states at the end of the run (measured, estimated, their
// difference and the ZeRO paper's figure), a table of peaks, and the
// verdict. The same content as plain text (the terminal) and Markdown.
#pragma once

#include <string>
#include <vector>

#include "options.h"
#include "runs.h"

namespace memory_compare {

enum class Format { kText, kMarkdown };

std::string format_report(const std::vector<Comparison>& runs, const Options& opt, Format format);

// Every mismatch and rank difference of the runs; empty when the measured
// model states equal the estimate everywhere and all ranks agree.
std::vector<std::string> problems(const std::vector<Comparison>& runs);

}  // namespace memory_compare
