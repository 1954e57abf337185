#include "node/output_processor.h"

#include <algorithm>

namespace dsv4 {

const char* PhaseName(Phase p) { return p == Phase::kReasoning ? "reasoning" : "content"; }

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kRepetition: return "repetition";
  }
  return "error";
}

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, OutputOptions options)
    : tok_(tokenizer),
      opt_(std::move(options)),
      decoder_(tokenizer, /*skip_special_tokens=*/true),
      repetition_(opt_.repetition),
      phase_(opt_.initial_phase) {}

std::string OutputProcessor::Release(const std::string& delta, TokenOutcome* out) {
  held_ += delta;
  if (opt_.stop_strings.empty()) {
    std::string all = std::move(held_);
    held_.clear();
    return all;
  }
  // A match can only start inside the held text: released text never ends with a proper prefix
  // of a stop string.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : opt_.stop_strings) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > which->size()))) {
      best = at;
      which = &s;
    }
  }
  if (which != nullptr) {
    std::string released = held_.substr(0, best);
    if (opt_.include_stop_str_in_output) released += *which;
    out->finished = true;
    out->reason = FinishReason::kStop;
    out->stop.kind = StopInfo::Kind::kStopString;
    out->stop.text = *which;
    out->discarded_text = held_.substr(best + which->size());
    held_.clear();
    return released;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : opt_.stop_strings) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string released = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return released;
}

std::string OutputProcessor::FlushText() {
  std::string out = std::move(held_);
  held_.clear();
  out += decoder_.Finish();
  return out;
}

TokenOutcome OutputProcessor::OnToken(int32_t token) {
  TokenOutcome out;
  out.channel = phase_;
  ++completion_;
  if (phase_ == Phase::kReasoning) ++reasoning_;
  if (token == opt_.think_end_id && phase_ == Phase::kReasoning) {
    // Close the reasoning channel: whatever it held is streamed now, as reasoning.
    out.text = FlushText();
    phase_ = Phase::kContent;
  } else if (token == opt_.think_start_id && phase_ == Phase::kContent) {
    out.text = FlushText();
    if (!out.text.empty()) content_bytes_ += static_cast<int64_t>(out.text.size());
    phase_ = Phase::kReasoning;
    out.channel = Phase::kContent;
  } else {
    out.text = Release(decoder_.Push(token), &out);
    if (out.channel == Phase::kContent) content_bytes_ += static_cast<int64_t>(out.text.size());
  }
  if (!out.finished) {
    const bool eos = std::find(opt_.eos_token_ids.begin(), opt_.eos_token_ids.end(), token) !=
                     opt_.eos_token_ids.end();
    const bool stop_token = std::find(opt_.stop_token_ids.begin(), opt_.stop_token_ids.end(),
                                      token) != opt_.stop_token_ids.end();
    if (stop_token || (eos && !opt_.ignore_eos)) {
      out.finished = true;
      out.reason = FinishReason::kStop;
      out.stop.kind = stop_token ? StopInfo::Kind::kStopToken : StopInfo::Kind::kEos;
      out.stop.token = token;
    } else if (completion_ >= opt_.max_tokens) {
      out.finished = true;
      out.reason = FinishReason::kLength;
    }
  }
  if (opt_.repetition_mode != RepetitionMode::kOff) {
    const int32_t period = repetition_.Push(token);
    if (period > 0 && !repetition_seen_) {
      repetition_seen_ = true;
      out.repetition_detected_now = true;
      if (opt_.repetition_mode == RepetitionMode::kStop && !out.finished) {
        out.finished = true;
        out.reason = FinishReason::kRepetition;
      }
    }
  }
  if (out.finished && out.stop.kind != StopInfo::Kind::kStopString) {
    const std::string rest = FlushText();
    out.text += rest;
    if (out.channel == Phase::kContent) content_bytes_ += static_cast<int64_t>(rest.size());
  }
  finished_ = out.finished;
  return out;
}

std::string OutputProcessor::Flush() {
  finished_ = true;
  std::string rest = FlushText();
  if (phase_ == Phase::kContent) content_bytes_ += static_cast<int64_t>(rest.size());
  return rest;
}

}  // namespace dsv4
