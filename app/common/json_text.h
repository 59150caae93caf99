#pragma once
// The JSON records people and scripts read (bench.json, loader_bench.json) are built as
// nlohmann::ordered_json (keys stay in the order written) and written one way.
#include <nlohmann/json.hpp>
#include <string>

namespace trainer {

// `value` indented by 2 with a final newline. Bytes that are not UTF-8 (a host name, a path) become
// U+FFFD: a record must not be lost to them. NaN is written as null.
std::string json_text(const nlohmann::ordered_json& value);

// `value` as printf's "%.*f" with `decimals` writes it (1234.56789, 3 -> 1234.568), for figures whose
// later digits are noise (img/s, seconds). NaN stays NaN.
double rounded(double value, int decimals);

// `value` to `digits` significant digits, as "%.*g" writes it (0.00625000001, 6 -> 0.00625).
double significant(double value, int digits);

}  // namespace trainer
