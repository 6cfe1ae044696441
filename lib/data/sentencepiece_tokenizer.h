// sentencepiece_tokenizer.h: Megatron's three SentencePiece tokenizers over a .model file (--tokenizer-model),
// through the SentencePiece library (libsentencepiece-dev):
//   GPTSentencePieceTokenizer: the model's ids; end of document = the model's </s> (eos).
//   Llama2Tokenizer: <s> (bos) first, then the model's ids; end of document = </s>.
//   SentencePieceTokenizer: the model's vocabulary plus Megatron's special tokens where the model lacks them
//     (<CLS>, <SEP>, <EOD>, <MASK>, then the model's pad / bos / eos pieces or <PAD>, <BOS>, <EOS>), each new one
//     the next id; those tokens inside the text become their ids; end of document = <EOD>.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace mt {

// type: one of the three names above; throws ConfigError when the file cannot be read or SentencePiece is not built in.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& type, const std::string& model_file);

}  // namespace mt
