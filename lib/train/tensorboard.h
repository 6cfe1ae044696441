// tensorboard.h: --tensorboard-dir: scalars in TensorBoard's event-file format, written without TensorFlow
// or protobuf: TFRecord framing (length, masked CRC-32C of the length, a serialized Event, masked CRC-32C
// of the data) around hand-encoded Event / Summary messages. TensorBoard reads any file in the directory
// whose name contains "tfevents".
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace mt {

// CRC-32C (Castagnoli), and TFRecord's masked form of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates dir and a new events.out.tfevents.<unix time>.<host>.<pid> file in it (its first record names the
  // format version). Throws with the path named when it cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace mt
