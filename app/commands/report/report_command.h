#pragma once
// `trainer report RUN_DIR [RUN_DIR...] [--out FILE.html]`: charts and the summary of one or more runs as
// one self-contained HTML file (app/commands/report/report_html.h).
#include <string>
#include <vector>

namespace trainer {

int report_command(const std::vector<std::string>& args);

}  // namespace trainer
