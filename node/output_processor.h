// OutputProcessor: turns one request's sampled tokens into streamed text and a finish decision.
// Pure logic (no clock, no I/O), one instance per request, driven by the engine thread.
//
//  * Phase: reasoning until </think>, then content (<think> switches back). Each token is
//    reported in the channel it was generated in; </think> belongs to reasoning.
//  * Text: incremental detokenization that never splits a UTF-8 character, special tokens
//    skipped. Stop strings are matched on the generated text of the current channel; text that
//    could be the start of a stop string is held back until it is known not to be one.
//  * Finish: end-of-sequence (unless ignore_eos), a stop token, a stop string, max_tokens, or the
//    repetition detector (when its action is stop), in that order of precedence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "node/repetition.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4 {

enum class Phase { kReasoning, kContent };
enum class FinishReason { kStop, kLength, kCancelled, kError, kRepetition };
enum class RepetitionMode { kOff, kObserve, kStop };

const char* PhaseName(Phase p);               // "reasoning" | "content"
const char* FinishReasonName(FinishReason r); // "stop" | "length" | ...

struct StopInfo {
  enum class Kind { kNone, kEos, kStopToken, kStopString } kind = Kind::kNone;
  int32_t token = -1;
  std::string text;
};

struct OutputOptions {
  std::vector<int32_t> eos_token_ids;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  bool include_stop_str_in_output = false;
  int32_t max_tokens = 1;
  Phase initial_phase = Phase::kContent;
  int32_t think_start_id = -1;
  int32_t think_end_id = -1;
  RepetitionMode repetition_mode = RepetitionMode::kObserve;
  RepetitionConfig repetition;
};

struct TokenOutcome {
  std::string text;       // text to stream with this token (may be empty)
  Phase channel = Phase::kContent;
  bool finished = false;
  FinishReason reason = FinishReason::kStop;
  StopInfo stop;
  bool repetition_detected_now = false;  // first detection for this request
  std::string discarded_text;            // after a stop-string match: held text never streamed
};

class OutputProcessor {
 public:
  OutputProcessor(const Tokenizer* tokenizer, OutputOptions options);

  TokenOutcome OnToken(int32_t token);
  // Ends the request for an outside reason (cancel, error, model length); returns the held-back
  // text, which the caller may stream before the finish event.
  std::string Flush();

  Phase phase() const { return phase_; }
  int32_t completion_tokens() const { return completion_; }
  int32_t max_tokens() const { return opt_.max_tokens; }
  int32_t reasoning_tokens() const { return reasoning_; }
  int32_t content_tokens() const { return completion_ - reasoning_; }
  int64_t content_text_bytes() const { return content_bytes_; }
  bool repetition_detected() const { return repetition_seen_; }
  bool finished() const { return finished_; }

 private:
  // Appends decoded text to the held buffer and releases what cannot start a stop string.
  // Returns the released text; sets *match when a stop string matched.
  std::string Release(const std::string& delta, TokenOutcome* match);
  std::string FlushText();

  const Tokenizer* tok_;
  OutputOptions opt_;
  StreamDecoder decoder_;
  RepetitionDetector repetition_;
  std::string held_;
  Phase phase_;
  int32_t completion_ = 0;
  int32_t reasoning_ = 0;
  int64_t content_bytes_ = 0;
  bool repetition_seen_ = false;
  bool finished_ = false;
};

}  // namespace dsv4
