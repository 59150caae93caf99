#pragma once
// One way to say what to do about a failed file-system call, for every folder that writes files (the
// run's CSVs and logs in metrics/, safetensors in nn/, the run directories in app/): the errno of the
// failure -> a HINT the user can act on.
#include <string>

namespace trainer {

// "this user may not write there: ..." for EACCES, and so on; a general hint for other errors.
std::string file_error_hint(int error);

}  // namespace trainer
