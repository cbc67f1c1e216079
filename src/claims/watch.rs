//! Live watches into claim stores (being written).
