"""From logits to tokens: penalties, bias, grammar masks, sampling, detokenising."""
